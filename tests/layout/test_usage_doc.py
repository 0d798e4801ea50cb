"""docs/USAGE.md is the reference (issue 48): every flag of every command's argparse parser
appears in that command's section, and every key a ddptop TUI class binds appears in the key
table marked for that class. Flags, choices and keys are read from the parsers and the
classes' BINDINGS themselves, so a flag or key added without its doc line fails here."""

from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from textual.binding import Binding
from textual.keys import format_key, key_to_character

import ddptop.commands
import ddptop.tui
from ddptop import cli

USAGE = Path(__file__).resolve().parents[2] / "docs" / "USAGE.md"
KEYS_HEADING = "Keys"
MARKER = re.compile(r"<!-- keys: (\w+) -->")


def sections(text: str) -> dict[str, str]:
    """Each `## ` section's text (its `###` subsections included), by its heading."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def command_section(text: str, name: str) -> str:
    """The section of `ddptop NAME` ('' for the run itself): its heading starts with `ddptop NAME`."""
    want = f"`ddptop{' ' + name if name else ''}`"
    found = [body for head, body in sections(text).items() if head.split(":")[0].strip() == want]
    assert len(found) == 1, f"docs/USAGE.md: want one '## {want}: ...' section, found {len(found)}"
    return found[0]


def parser_factories() -> dict[str, Callable[[], argparse.ArgumentParser]]:
    """`<name>_parser` functions of ddptop.commands' modules, by name."""
    out: dict[str, Callable[[], argparse.ArgumentParser]] = {}
    for mod in pkgutil.iter_modules(ddptop.commands.__path__):
        module = importlib.import_module(f"ddptop.commands.{mod.name}")
        for fname, fn in vars(module).items():
            if fname.endswith("_parser") and inspect.isfunction(fn) and fn.__module__ == module.__name__:
                out[fname.removesuffix("_parser")] = fn
    return out


def command_parsers() -> dict[str, argparse.ArgumentParser | None]:
    """Every command's parser: '' is `ddptop` itself, then each of cli.SUBCOMMANDS by its
    `<name>_parser()`; None for a subcommand without one (it must take no arguments)."""
    factories = parser_factories()
    return {"": cli.run_parser(), **{name: factories[name]() if name in factories else None
                                     for name in cli.SUBCOMMANDS}}


def mentioned(word: str, text: str) -> bool:
    """`word` (a flag, a choice) stands in `text` on its own: `--token` is not `--token-file`."""
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


def missing_flags(parsers: dict[str, argparse.ArgumentParser | None], text: str) -> list[str]:
    """'ddptop NAME --flag' for each option string, and each choice of an option, that NAME's
    section does not name."""
    out = []
    for name, parser in parsers.items():
        body = command_section(text, name)
        for action in parser._actions if parser else ():
            words = [*action.option_strings, *(str(c) for c in action.choices or () if action.option_strings)]
            out += [f"ddptop {name} {w}".replace("  ", " ") for w in words if not mentioned(w, body)]
    return out


def test_every_flag_of_every_parser_is_in_its_commands_section() -> None:
    parsers = command_parsers()
    assert set(parsers) == {"", *cli.SUBCOMMANDS}
    assert sum(len(p._actions) for p in parsers.values() if p) > 60  # the parsers were read, not empty
    assert missing_flags(parsers, USAGE.read_text()) == []


def test_every_setting_of_runconfig_is_in_the_settings_table() -> None:
    """`--set NAME=VALUE` takes any RunConfig field: each is in the presets section's table."""
    from dataclasses import fields

    from ddptop.model.config import RunConfig

    body = command_section(USAGE.read_text(), "presets")
    table = "\n".join(line for line in body.splitlines() if line.startswith("| `"))
    assert [f.name for f in fields(RunConfig) if f"`{f.name}`" not in table] == []


@pytest.mark.parametrize("name", [n for n in cli.SUBCOMMANDS if n not in parser_factories()])
def test_a_subcommand_without_a_parser_takes_no_arguments(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Its section lists no flags because it has none: any argument is a usage error."""
    assert cli.main([name, "--anything"]) == 2
    assert "takes no arguments" in capsys.readouterr().err
    assert command_section(USAGE.read_text(), name)


def test_a_flag_added_without_its_doc_is_caught() -> None:
    parsers = command_parsers()
    sweep = parsers["sweep"]
    assert sweep is not None
    sweep.add_argument("--brand-new-knob", choices=("zigzag", "quux"))
    parsers[""].add_argument("--json-lines")  # a prefix of nothing documented, `--json` is
    assert missing_flags(parsers, USAGE.read_text()) == [
        "ddptop --json-lines", "ddptop sweep --brand-new-knob", "ddptop sweep zigzag", "ddptop sweep quux"]


def doc_key(key: str) -> str:
    """How docs/USAGE.md writes a Textual key: its character (`?`, `<`, `+`), `F1`, or its
    name (`space`, `escape`, `enter`, `ctrl+s`, `pageup`)."""
    if re.fullmatch(r"f\d+", key):
        return key.upper()
    char = key_to_character(key)
    if char and char.isprintable() and not char.isspace():
        return char
    shown = format_key(key)
    return shown if len(shown) == 1 and shown.isascii() and shown.isprintable() and not shown.isspace() else key


def binding_classes() -> Iterator[type]:
    """Every class of ddptop.tui that declares its own BINDINGS."""
    for mod in pkgutil.walk_packages(ddptop.tui.__path__, "ddptop.tui."):
        module = importlib.import_module(mod.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and "BINDINGS" in vars(cls):
                yield cls


def class_keys(cls: type) -> set[str]:
    keys = set()
    for b in vars(cls)["BINDINGS"]:
        key = b.key if isinstance(b, Binding) else b[0]
        keys |= {k.strip() for k in key.split(",")}
    return keys


def key_blocks(text: str) -> dict[str, str]:
    """The Keys section cut at each `<!-- keys: Class -->` marker: each class's block of text."""
    body = sections(text)[KEYS_HEADING]
    parts = MARKER.split(body)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def missing_keys(classes: list[type], text: str) -> list[str]:
    blocks = key_blocks(text)
    out = []
    for cls in classes:
        if cls.__name__ not in blocks:
            out.append(f"{cls.__name__}: no '<!-- keys: {cls.__name__} -->' block under ## {KEYS_HEADING}")
            continue
        out += [f"{cls.__name__}: `{doc_key(k)}` ({k})" for k in sorted(class_keys(cls))
                if f"`{doc_key(k)}`" not in blocks[cls.__name__]]
    return out


def test_every_key_the_tui_binds_is_in_its_key_table() -> None:
    from ddptop.tui.app import DdpTopApp
    from ddptop.tui.keys import BINDINGS

    classes = list(binding_classes())
    assert DdpTopApp in classes and vars(DdpTopApp)["BINDINGS"] is BINDINGS  # the app's key map is read
    assert len(classes) >= 10
    assert missing_keys(classes, USAGE.read_text()) == []
    # every block names a class that still binds keys: no stale table
    assert set(key_blocks(USAGE.read_text())) <= {c.__name__ for c in classes}


def test_a_key_added_without_its_doc_is_caught() -> None:
    from ddptop.tui.widgets.runs_panel import RunsPanel

    class RunsPanel2(RunsPanel):
        BINDINGS = [*RunsPanel.BINDINGS, Binding("question_mark", "x", "X"), Binding("f7", "y", "Y")]

    RunsPanel2.__name__ = "RunsPanel"
    assert doc_key("question_mark") == "?" and doc_key("less_than_sign") == "<" and doc_key("plus") == "+"
    assert doc_key("f7") == "F7" and doc_key("space") == "space" and doc_key("enter") == "enter"
    assert missing_keys([RunsPanel2], USAGE.read_text()) == ["RunsPanel: `F7` (f7)", "RunsPanel: `?` (question_mark)"]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    """Every heading's anchor in `doc`, a repeated one with GitHub's -1, -2..."""
    out: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", doc.read_text(), flags=re.M):
        base = anchor = slug(heading)
        n = 0
        while anchor in out:
            n += 1
            anchor = f"{base}-{n}"
        out.add(anchor)
    return out


def broken_links(doc: Path) -> list[str]:
    """Relative links of `doc` whose file is missing, or whose #anchor no heading there gives."""
    out = []
    for target, anchor in re.findall(r"\]\(([^)#:\s]*)(?:#([^)\s]*))?\)", doc.read_text()):
        path = (doc.parent / target).resolve() if target else doc
        if not path.exists() or (anchor and path.suffix == ".md" and anchor not in anchors(path)):
            out.append(f"{target}#{anchor}")
    return out


@pytest.mark.parametrize("doc", ["README.md", "docs/USAGE.md", "docs/BENCHMARKS.md", "docs/GPU.md"])
def test_the_docs_links_lead_somewhere(doc: str) -> None:
    """The README's links into docs/, USAGE's own, and each current figure's link to the dated
    entry it comes from."""
    assert broken_links(USAGE.parent.parent / doc) == []


def test_benchmarks_and_gpu_lead_with_current_figures() -> None:
    """Each starts with its current figures, every table row there pointing to a dated entry
    below; the dated logs follow."""
    for name in ("BENCHMARKS.md", "GPU.md"):
        doc = USAGE.parent / name
        heads = re.findall(r"^## (.+)$", doc.read_text(), flags=re.M)
        assert heads[0] == "Current figures", name
        current = sections(doc.read_text())["Current figures"]
        rows = [r for r in re.findall(r"^\|(?!---).*\|$", current, flags=re.M) if not r.startswith(("| workload", "| part", "| question", "| script"))]
        assert len(rows) >= 8, name
        linked = [r for r in rows if re.search(r"\]\((?:BENCHMARKS\.md)?#", r) or r.rstrip(" |").endswith("same")]
        assert linked == rows, name


def table_keys(text: str) -> list[str]:
    """The backticked keys in the first column of the key tables (`| key | what ... |`) of `text`."""
    out: list[str] = []
    for table in re.findall(r"^\| key \|.*\n\|[-| ]+\|\n((?:\|.*\n)+)", text, flags=re.M):
        for row in table.splitlines():
            out += re.findall(r"`([^`]+)`", row.split("|")[1])
    return out


def bound_keys() -> set[str]:
    """Every key the app answers, as the docs write them: ddptop's bindings, Textual's own
    (ctrl+q, the palette's ctrl+p), and the dialogs' answer keys."""
    from textual.app import App

    from ddptop.tui.app import DdpTopApp

    keys = {k for cls in binding_classes() for k in class_keys(cls)}
    keys |= {b.key for b in App.BINDINGS if isinstance(b, Binding)} | {DdpTopApp.COMMAND_PALETTE_BINDING}
    return {doc_key(k) for k in keys}


def test_the_key_tables_name_only_keys_that_are_bound() -> None:
    """A key table, in the README or in docs/USAGE.md, never offers a key nothing answers."""
    bound = bound_keys()
    for doc in (README, USAGE):
        keys = table_keys(doc.read_text())
        assert len(keys) > 30, doc
        assert [k for k in keys if k not in bound] == [], doc.name


README = USAGE.parent.parent / "README.md"
README_LINES = 250


def test_the_readme_fits_in_one_read_and_runs_what_ci_runs() -> None:
    """The README is a front door: at most 250 lines of text (`grep -c . README.md`), its test
    command the one .ci/run runs, every file it links there, and the reference one link away."""
    text = README.read_text()
    assert sum(1 for line in text.splitlines() if line.strip()) <= README_LINES
    ci = (README.parent / ".ci" / "run").read_text()
    test_cmd = next(line.strip() for line in ci.splitlines() if "pytest" in line)
    assert test_cmd in text
    assert "](docs/USAGE.md)" in text and "](screenshots/" in text
