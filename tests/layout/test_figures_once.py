"""One figure, one function (issue 29): every percentile, median, mean, percentage, share,
union of spans and per-second rate is computed in ddptop/model/figures/, and every view, the
summary, the advisor and the sweep table read the same number for the same run."""

from __future__ import annotations

import ast
import copy
import re
import sys
from pathlib import Path

import pytest

from ddptop.analysis.advisor import advise
from ddptop.commands.sweep_table import build_rows
from ddptop.model import figures
from ddptop.model.config import RunConfig
from ddptop.model.snapshot import snapshot
from ddptop.model.state import RunState
from ddptop.tui.widgets.run_header import comm_text
from ddptop.wire.protocol import Hello, Steps

PACKAGE = Path(__file__).resolve().parents[2] / "ddptop"
FIGURES = PACKAGE / "model" / "figures"

# What a figure helper is called: a percentile, median, mean, percentage, share, the union of
# spans, a rate per second (with or without a window suffix or a leading underscore).
FIGURE_NAME = re.compile(
    r"^_?(pct|pcts|percent|percentile|median|mean|merge|merged|merge_spans|union|union_length|"
    r"span_length|shares?|ratio|speedup)$"
    r"|(^|_)(comm|exposed|mean|phase)_shares?(_|$)"
    r"|(samples|steps|tokens)_per_s(_|$)"
)
# Defined elsewhere on purpose, each with why.
ELSEWHERE = {
    # The rank side may import nothing of the monitor (tests/layout/test_boundaries.py): its own union
    # of the buckets' spans stays there.
    ("rank/steps.py", "union_length"),
    # A named straggler's excess over its own step: one definition, on the Finding it describes.
    ("model/straggler.py", "share"),
    # Interning repeated strings of a trace, not a figure.
    ("analysis/event_store.py", "_share"),
}


def _delegates_to_figures(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """The whole body (a docstring aside) is `return figures.<name>(...)`: a reading of the one
    function under an older name (RunState.steps_per_s), not a second computation."""
    body = fn.body[1:] if fn.body and isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant) else fn.body
    if len(body) != 1 or not isinstance(body[0], ast.Return) or not isinstance(body[0].value, ast.Call):
        return False
    func = body[0].value.func
    return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "figures"


def figure_helpers_outside() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if FIGURES in path.parents:
            continue
        rel = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and FIGURE_NAME.search(node.name)
                    and (rel, node.name) not in ELSEWHERE and not _delegates_to_figures(node)):
                found.append(f"{rel}:{node.lineno} {node.name}()")
    return found


def test_no_figure_helper_is_defined_outside_the_figures_package():
    assert figure_helpers_outside() == []


def test_the_scan_finds_a_figure_helper_and_knows_a_delegate():
    names = ["_pct", "pct", "percentile", "median", "_median", "_mean", "comm_shares", "comm_share_run",
             "samples_per_s", "job_samples_per_s_run", "phase_shares", "union_length", "_merged", "share"]
    assert [n for n in names if not FIGURE_NAME.search(n)] == []
    assert [n for n in ("share_text", "median_ci", "merge_rows", "by_share_only", "recent_values")
            if FIGURE_NAME.search(n)] == []
    tree = ast.parse("def steps_per_s(self):\n    '''doc'''\n    return figures.job_steps_per_s_run(self.ranks)\n"
                     "def samples_per_s(self):\n    return self.a / self.b\n")
    assert [_delegates_to_figures(f) for f in tree.body] == [True, False]  # type: ignore[arg-type]
    # each name the ELSEWHERE list keeps is still there (a stale entry would hide nothing)
    for rel, name in ELSEWHERE:
        assert re.search(rf"def {name}\(", (PACKAGE / rel).read_text()), (rel, name)


# --- the same number everywhere -------------------------------------------------------------

def _rec(step: int, step_ms: float, comm_ms: float, exposed_ms: float) -> dict[str, float]:
    return {"step": step, "t": float(step), "step_ms": step_ms, "data_ms": 1.0, "forward_ms": 2.0,
            "backward_ms": step_ms - 4.0, "optimizer_ms": 1.0, "samples": 32,
            "comm_ms": comm_ms, "exposed_comm_ms": exposed_ms}


def _run() -> RunState:
    """Two ranks, 40 timed steps each, no warmup: the last-50 window is the whole run, so the
    header's window and the summary's hold the same steps."""
    state = RunState(run_id="r", config=RunConfig(preset="baseline", steps=40), world_size=2, warmup=0)
    for rank in range(2):
        state.apply(Hello(rank=rank, local_rank=rank, world_size=2, host="h", pid=100 + rank, token="t",
                          backend="gloo"), 0.0)
        state.apply(Steps(rank, [_rec(i, 40.0 + rank * 2 + i % 3, 9.0 + rank + i % 5, 2.0 + i % 2)
                                 for i in range(40)]), 1.0)
    return state


def test_advisor_summary_header_and_sweep_table_read_the_same_comm_share():
    state = _run()
    summary = state.summary()
    share, exposed = summary["comm_share"], summary["exposed_comm_share"]
    assert share is not None and 0.1 < share < 0.5 and exposed is not None

    # the run window over the ranks, from the one function
    assert share == pytest.approx(figures.mean_share_run(state.ranks.values(), "comm_ms"), abs=1e-4)
    # the header (window last 50, the whole run here), and its text
    snap = snapshot(state, 2.0)
    assert snap.comm is not None
    assert snap.comm[0] == pytest.approx(share, abs=1e-4) and snap.comm[1] == pytest.approx(exposed, abs=1e-4)
    assert f"comm {share:.0%} of step" in comm_text(snap.comm).plain
    # the advisor: what it judges by, and what its evidence says
    assert figures.summary_comm_shares(summary) == (share, exposed)
    advice = advise(summary)
    assert f"all-reduce {share:.0%} of the step" in advice.evidence
    # the sweep table's row
    (row,) = build_rows([summary])
    assert (row["comm_share"], row["exposed_comm_share"]) == (share, exposed)


# --- no logic written twice -------------------------------------------------------------------

class _Anonymous(ast.NodeTransformer):
    """Names and arguments blanked: a copy with its variables renamed is still a copy."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.copy_location(ast.Name(id="_", ctx=node.ctx), node)

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg, node.annotation = "_", None
        return node


MIN_NODES = 20  # smaller bodies (a property's `end - start`, a unit conversion) are not counted
# Copies in parts of the package this change does not own (issue 29 lists them).
KNOWN_COPIES = [{"run/keeper.py _running", "run/launcher.py _alive"}]


def function_copies() -> list[set[str]]:
    """Functions anywhere in the package whose bodies (docstring aside, names blanked) are the
    same and at least MIN_NODES AST nodes big."""
    bodies: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]
            tree = _Anonymous().visit(ast.Module(body=copy.deepcopy(body), type_ignores=[]))
            if sum(1 for _ in ast.walk(tree)) >= MIN_NODES:
                bodies.setdefault(ast.dump(tree, annotate_fields=False), set()).add(f"{rel} {node.name}")
    return [names for names in bodies.values() if len(names) > 1]


def test_no_function_body_is_written_twice():
    assert [c for c in function_copies() if c not in KNOWN_COPIES] == []


def test_the_copy_finder_sees_a_renamed_copy(tmp_path, monkeypatch):
    body = "    total = 0\n    for v in values:\n        if v is not None:\n            total += v * 2\n    return total\n"
    (tmp_path / "a.py").write_text("def one(values):\n" + body)
    (tmp_path / "b.py").write_text("def two(items):\n" + body.replace("values", "items").replace("total", "acc"))
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    assert function_copies() == [{"a.py one", "b.py two"}]
