"""Typed state (issue 29): run and rank statuses are str-valued enums with `is_live` (the live
set written once), and RunState, RankState and Snapshot annotate their fields precisely: no
`Any` at all (issue 48: the config is a RunConfig, free-form JSON is typed as such)."""

from __future__ import annotations

import ast
import collections.abc
import json
import typing
from pathlib import Path

import pytest

from ddptop.model.capture import Capture
from ddptop.model.config import RunConfig
from ddptop.model.plain_data import NsysReport
from ddptop.model.rank_state import RankState
from ddptop.model.snapshot import Snapshot
from ddptop.model.state import RunState
from ddptop.model.status import RankStatus, RunStatus, rank_is_live, run_is_live
from ddptop.wire.protocol import Bye, Hello, Steps

PACKAGE = Path(__file__).resolve().parents[2] / "ddptop"

# The run model's modules: `grep -n Any` on them prints nothing (issue 48).
RUN_MODEL = ("model/state.py", "model/rank_state.py", "model/snapshot.py")


def mentions_any(tp: object) -> bool:
    if tp is typing.Any:
        return True
    return any(mentions_any(arg) for arg in typing.get_args(tp))


def fields_with_any(cls: type) -> list[str]:
    hints = typing.get_type_hints(cls)
    return [name for name, tp in hints.items() if mentions_any(tp)]


def test_mentions_any_sees_any_at_any_depth():
    assert mentions_any(typing.Any) and mentions_any(dict[int, typing.Any])
    assert mentions_any(collections.abc.Mapping[str, list[typing.Any]] | None)
    assert not mentions_any(dict[int, Capture]) and not mentions_any(tuple[float, ...] | None)


@pytest.mark.parametrize("cls", [RunState, RankState, Snapshot])
def test_no_field_is_annotated_any(cls):
    assert fields_with_any(cls) == []


def test_the_run_model_modules_never_say_any():
    """Not in a field, a signature or a local: `grep -n Any` on them prints nothing."""
    said = [f"{rel}:{n}: {line.strip()}" for rel in RUN_MODEL
            for n, line in enumerate((PACKAGE / rel).read_text().splitlines(), 1) if "Any" in line]
    assert said == []


def test_the_free_form_fields_are_typed():
    """The config is the RunConfig, a rank's facts are the protocol's, nsys's report its TypedDict."""
    hints = typing.get_type_hints(RunState)
    assert hints["config"] is RunConfig and hints["nsys"] == NsysReport | None
    assert typing.get_type_hints(RankState)["info"] == dict[str, str | int | float | bool]


def test_statuses_are_their_words():
    assert RunStatus.RUNNING == "running" and RankStatus.DONE == "done"
    assert f"{RankStatus.LOST}" == "lost" and str(RunStatus.COMPLETED) == "completed"
    assert json.dumps({"status": RunStatus.STOPPED}) == '{"status": "stopped"}'
    assert {"running": "green"}.get(RankStatus.RUNNING) == "green"  # styles keyed by the word
    assert [s for s in RunStatus if s.is_live] == [RunStatus.STARTING, RunStatus.RUNNING]
    assert [s for s in RankStatus if s.is_live] == [RankStatus.STARTING, RankStatus.RUNNING]
    assert all(s.is_terminal for s in RunStatus if not s.is_live)
    # a viewer's copy holds the plain word: the same answer
    assert rank_is_live("running") and not rank_is_live("lost") and run_is_live("starting")
    assert not run_is_live("completed")


def test_a_run_and_its_ranks_move_through_their_statuses():
    state = RunState(run_id="r", config=RunConfig(), world_size=3)
    assert state.status is RunStatus.STARTING and state.ranks[0].status is RankStatus.STARTING
    state.apply(Hello(rank=0, local_rank=0, world_size=3, host="h", pid=1, token="t"), 0.0)
    state.apply(Steps(0, [{"step": 0, "t": 0.0, "step_ms": 10.0}]), 1.0)
    assert state.status is RunStatus.RUNNING and state.ranks[0].status is RankStatus.RUNNING
    state.apply(Bye(rank=0, reason="completed"), 2.0)
    state.apply(Bye(rank=1, reason="crashed"), 2.0)
    assert state.ranks[0].status is RankStatus.DONE and state.ranks[1].status is RankStatus.CRASHED
    state.apply(Bye(rank=2, reason="odd reason"), 2.0)
    assert state.ranks[2].status == "odd reason"  # a word ddptop does not know stays as it came
    state.finish("failed", 3.0, failed_rank=1)
    assert state.status is RunStatus.FAILED and state.finished
    assert state.ranks[1].status is RankStatus.FAILED
    assert state.summary()["status"] == "failed"
    with pytest.raises(ValueError):
        state.finish("running", 4.0)
    # whoever writes the word (a test, the viewer codec decoding a snapshot), the state holds the enum
    state.status = "running"
    state.ranks[0].status = "lost"
    assert state.status is RunStatus.RUNNING and state.ranks[0].status is RankStatus.LOST
    assert RunState(run_id="v", config=RunConfig(), world_size=1, status="stopped").status is RunStatus.STOPPED


def test_the_live_set_is_written_once():
    """No tuple or set of status words holding both "starting" and "running" outside
    ddptop/model/status.py. KNOWN: run/ files of another engineer's part (issue 29 lists them)."""
    known = {"run/outcome.py", "run/watchdog.py"}
    found = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.Set, ast.List)):
                words = {e.value for e in node.elts if isinstance(e, ast.Constant)}
                if {"starting", "running"} <= words:
                    found.add(rel)
    assert found <= known, found - known
