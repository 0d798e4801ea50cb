"""The monitor must never import torch (fast start on login nodes), and pure
modules must not import the UI."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

NO_TORCH = ["ddptop.cli", "ddptop.run.session", "ddptop.commands.headless", "ddptop.probe", "ddptop.run.hub",
            "ddptop.model.state", "ddptop.model.config", "ddptop.wire.protocol", "ddptop.run.launcher", "ddptop.model.report",
            "ddptop.commands.sweep", "ddptop.analysis.advisor", "ddptop.analysis.capture", "ddptop.analysis.nccl", "ddptop.hw.gpu",
            "ddptop.remote.live", "ddptop.remote.supervisor", "ddptop.remote.viewer", "ddptop.viewer_wire.viewer_protocol", "ddptop.commands.attach",
            "ddptop.run.workbench", "ddptop.run.nsys"]
PURE = ["ddptop.model.config", "ddptop.wire.protocol", "ddptop.model.state", "ddptop.model.figures", "ddptop.model.snapshot", "ddptop.model.failures", "ddptop.analysis.advisor", "ddptop.analysis.nccl",
        "ddptop.viewer_wire.viewer_protocol", "ddptop.viewer_wire.state_codec", "ddptop.analysis.nsys_stats"]


def loaded_after_import(module: str) -> set[str]:
    code = f"import sys, {module}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


@pytest.mark.parametrize("module", NO_TORCH)
def test_monitor_modules_do_not_import_torch(module):
    mods = loaded_after_import(module)
    assert "torch" not in mods
    assert "textual" not in mods  # the UI is imported only when the TUI starts


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_do_no_io_imports(module):
    mods = loaded_after_import(module)
    assert not {"asyncio", "socket", "subprocess", "textual", "pynvml"} & mods, module


PACKAGE = Path(__file__).resolve().parents[2] / "ddptop"
# No module imports itself back, even lazily (probe.py re-exports rank/client.py, which
# imports only the wire format).
KNOWN_CYCLES: list[set[str]] = []


def import_graph() -> dict[str, set[str]]:
    """module -> the ddptop modules it imports anywhere in its source (lazy imports too)."""
    files = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
             for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
        graph[mod] = {n for n in names if n in files and n != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_among_ddptop_modules():
    graph = import_graph()
    assert len(graph) > 50 and "ddptop.tui.app" in graph and "ddptop.rank.attach" in graph
    found = cycles(graph)
    assert sorted(map(sorted, found)) == sorted(map(sorted, KNOWN_CYCLES)), found


def test_textual_only_under_tui():
    """The model, run, remote (the web view included) and command modules never import the UI
    toolkit, even lazily."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("tui/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(m == "textual" or m.startswith("textual.") for m in mods):
                offenders.append(rel)
    assert offenders == []


# --- the folders (docs/ARCHITECTURE.md): what each may import, checked on every module ----------

def module_of(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")


def folder_of(module: str) -> str:
    """ddptop.run.hub -> run; ddptop.cli -> cli; ddptop.probe -> rank (the rank side's public path)."""
    parts = module.split(".")
    if parts[1:2] == ["probe"]:
        return "rank"
    return parts[1] if len(parts) > 1 else "ddptop"


def imports_of(path: Path) -> list[str]:
    """Every module a file imports, at any depth (lazy imports inside functions too)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


MONITOR = [p for p in PACKAGE.rglob("*.py") if folder_of(module_of(p)) != "rank"]
# The one order of the folders, top to bottom (docs/ARCHITECTURE.md draws it): a folder may
# import only the folders below it. rank/ (with probe.py) is on top because no folder may import
# it: nothing of the rank side runs in the monitor; it imports only wire/ (checked below). wire/
# is the bottom: the rank protocol, the one thing both processes load.
ORDER = ["rank", "__main__", "cli", "commands", "tui", "remote", "run", "viewer_wire", "analysis",
         "model", "hw", "wire"]
NEVER_IMPORTS = {folder: set(ORDER[:i]) for i, folder in enumerate(ORDER)}
PURE_FOLDERS = ("model", "wire", "viewer_wire", "analysis")
IO_MODULES = {"asyncio", "socket", "subprocess", "textual", "pynvml", "psutil", "shutil", "select",
              "signal", "threading", "urllib", "http", "aiohttp", "tempfile", "fcntl", "pty"}
IO_CALLS = {"open", "read_text", "write_text", "read_bytes", "write_bytes", "iterdir", "mkdir",
            "unlink", "rmdir", "glob", "rglob", "listdir", "makedirs", "remove", "rename", "replace_file"}


def folders_in_tree() -> set[str]:
    """Every folder of the package (ddptop/__init__.py, which only holds the version, aside)."""
    return {folder_of(module_of(p)) for p in PACKAGE.rglob("*.py")} - {"ddptop"}


def back_up(mod: str, names: list[str]) -> list[str]:
    """The imports of `mod` that point up: at a folder above its own in ORDER."""
    banned = NEVER_IMPORTS[folder_of(mod)]
    return [f"{mod} imports {n}" for n in names if n.startswith("ddptop.") and folder_of(n) in banned]


def test_the_order_names_every_folder_once():
    """A new folder gets a height before it gets code; none is left out of the rule."""
    assert len(ORDER) == len(set(ORDER))
    assert folders_in_tree() == set(ORDER)
    assert {"model", "analysis", "hw", "viewer_wire"} <= NEVER_IMPORTS["wire"] == set(ORDER) - {"wire"}
    assert NEVER_IMPORTS["rank"] == set()
    assert [n for n in imports_of(PACKAGE / "__init__.py") if n.startswith("ddptop")] == []


def test_every_folder_imports_only_below_itself():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        mod = module_of(path)
        if folder_of(mod) != "ddptop":
            offenders += back_up(mod, imports_of(path))
    assert offenders == []


def test_the_order_check_finds_an_arrow_back_up():
    """The rule is live: each of these would run back up, and is caught."""
    for mod, target in [("ddptop.model.state", "ddptop.viewer_wire.state_codec"),
                        ("ddptop.wire.protocol", "ddptop.model.state"),
                        ("ddptop.wire.protocol", "ddptop.analysis.capture"),
                        ("ddptop.wire.protocol", "ddptop.hw.samples"),
                        ("ddptop.hw.samples", "ddptop.model.config"),
                        ("ddptop.viewer_wire.schema", "ddptop.run.hub"),
                        ("ddptop.run.hub", "ddptop.rank.client"),
                        ("ddptop.cli", "ddptop.probe")]:
        assert back_up(mod, [target]) == [f"{mod} imports {target}"]
    assert back_up("ddptop.viewer_wire.schema", ["ddptop.model.state", "ddptop.wire.protocol"]) == []


def test_no_torch_anywhere_on_the_monitor_side():
    offenders = [f"{module_of(p)} imports {n}" for p in MONITOR for n in imports_of(p)
                 if n == "torch" or n.startswith("torch.")]
    assert offenders == []


def test_the_rank_side_imports_only_the_wire_format_and_itself():
    """Nothing of the monitor runs inside a user's rank: rank/ and probe.py import only
    ddptop.wire.protocol and each other (and trainer/ only those and the run config)."""
    allowed = {"ddptop.wire.protocol", "ddptop.wire"}
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        mod = module_of(path)
        if folder_of(mod) != "rank":
            continue
        offenders += [f"{mod} imports {n}" for n in imports_of(path) if n.startswith("ddptop")
                      and folder_of(n) != "rank" and n not in allowed]
    for path in (PACKAGE.parent / "trainer").glob("*.py"):
        offenders += [f"trainer/{path.name} imports {n}" for n in imports_of(path)
                      if n.startswith("ddptop") and folder_of(n) != "rank"
                      and n not in allowed | {"ddptop.model.config"}]
    assert offenders == []


def test_pure_folders_do_no_io():
    """model/, wire/ and analysis/ take data and return data: no files, sockets, processes,
    threads or UI, even lazily (their callers in run/, commands/ and hw/ do the I/O)."""
    offenders = []
    for path in MONITOR:
        mod = module_of(path)
        if folder_of(mod) not in PURE_FOLDERS:
            continue
        tree = ast.parse(path.read_text())
        offenders += [f"{mod} imports {n}" for n in imports_of(path) if n.split(".")[0] in IO_MODULES]
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                fn = node.func
                name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
                if name in IO_CALLS:
                    offenders.append(f"{mod}:{node.lineno} calls {name}()")
    assert offenders == []


def test_no_file_over_400_lines_and_no_function_over_60():
    too_long = []
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        if len(text.splitlines()) > 400:
            too_long.append(f"{module_of(path)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > 60:
                    too_long.append(f"{module_of(path)}:{node.lineno} {node.name}() {length} lines")
    assert too_long == []
