"""Issue 49, case 1 and 2: a runs dir holds whatever anyone who can write it put there. The runs
tab (and its Markdown export) shows it as data: a copied run dir (the same run id twice), a
summary whose `model` is a JSON object, a 200k-deep summary, `[/bold]` (Rich markup) and OSC 52 /
OSC 0 in a run id, a summary.json linked to /dev/zero or that is a FIFO. The TUI keeps running;
a viewer that fails anyway leaves the run it owns going (detached), and says so."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import threading
from pathlib import Path

import pytest
from test_detach import entry_of, live, tree, wait_gone, wait_until  # noqa: F401 - live: the fixture
from test_tui import START_TIMEOUT, cpu_config, wait_for
from test_tui_usability import screen_text, synthetic_app

from ddptop.run.runs import build_table, load_runs, markdown
from ddptop.run.untrusted import json_depth, read_json_object, read_text
from ddptop.tui.factory import build_app
from ddptop.tui.widgets.runs_panel import RunsPanel

OSC52 = "\x1b]52;c;ZWNobyBwd25lZA==\x07"  # base64 of `echo pwned`, into the terminal's clipboard
OSC0 = "\x1b]0;owned\x07"  # the pane's title


def summary(run_id: str, **fields: object) -> dict[str, object]:
    return {"run_id": run_id, "preset": "baseline", "status": "completed", "world_size": 2,
            "steps_per_s": 10.0, "model": "vit_tiny", "backend": "gloo", **fields}


def write_run(runs: Path, name: str, text: str) -> Path:
    run_dir = runs / name
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(text)
    return run_dir


def hostile_runs_dir(runs: Path) -> dict[str, Path]:
    """One run dir per case (no FIFO: see the test of its own); returns them by case."""
    good = write_run(runs, "20260101-000000-baseline", json.dumps(summary("20260101-000000-baseline")))
    copied = runs / "20260101-000000-baseline.bak"
    shutil.copytree(good, copied)  # `cp -r runs/R runs/R.bak`: the same run id twice
    return {
        "good": good, "copied": copied,
        "object": write_run(runs, "20260101-000001-x", json.dumps(summary("20260101-000001-x", model={"a": 1}))),
        "deep": write_run(runs, "20260101-000002-x", "[" * 200_000 + "]" * 200_000),
        "bignum": write_run(runs, "20260101-000003-x", '{"run_id": "big", "steps_per_s": ' + "9" * 5000 + "}"),
        "markup": write_run(runs, "20260101-000004-x", json.dumps(summary("20260101-000004-[/bold]x[red"))),
        "osc": write_run(runs, "20260101-000005-x", json.dumps(summary(f"20260101-000005-{OSC52}{OSC0}x"))),
    }


def test_the_runs_tab_shows_a_hostile_runs_dir_as_text_and_keeps_running(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    hostile_runs_dir(runs)
    zero = runs / "20260101-000006-x"
    zero.mkdir()
    (zero / "summary.json").symlink_to("/dev/zero")  # a plain read never ends (MemoryError)

    async def main() -> None:
        app, state = synthetic_app(runs, 2)
        async with app.run_test(size=(200, 40)) as pilot:
            await pilot.press("3")
            panel = app.query_one(RunsPanel)
            # this session's run, the good run and its copy, the JSON-object model, the markup id, the OSC id
            for _ in range(100):
                await pilot.pause(0.05)
                if panel.table.row_count == 6:
                    break
            assert panel.table.row_count == 6
            app.refresh_views(force_runs=True)  # and again: the same rows, nothing raised
            await pilot.pause(0.2)
            assert app.is_running and panel.table.row_count == 6
            text = screen_text(app)
            assert "[/bold]x[red" in text  # shown as written, never parsed as markup
            assert "\x1b" not in text and "^[]52;c;ZWNobyBwd25lZA==^G^[]0;owned^Gx" in text
            await pilot.press("b")  # a reference chosen on a row whose run id is repeated
            await pilot.pause()
            assert app.is_running

    asyncio.run(main())


def test_fields_are_typed_rows_keyed_by_dir_and_the_export_is_text(tmp_path: Path) -> None:
    cases = hostile_runs_dir(tmp_path)
    rows = load_runs(tmp_path)
    by_dir = {Path(r.run_dir).name: r for r in rows}
    assert set(by_dir) == {cases[c].name for c in ("good", "copied", "object", "markup", "osc")}
    assert by_dir[cases["object"].name].model is None  # a JSON object is no model name
    assert len({r.key for r in rows}) == len(rows)  # the copy is a row of its own
    text = markdown(build_table(rows))
    assert "\x1b" not in text and "\x07" not in text and "^[]52;c;" in text


def test_a_fifo_or_a_link_to_dev_zero_never_blocks_or_floods_the_reader(tmp_path: Path) -> None:
    fifo_run = tmp_path / "20260101-000007-fifo"
    fifo_run.mkdir()
    fifo = fifo_run / "summary.json"
    os.mkfifo(fifo)  # a plain open() waits for a writer forever
    zero = tmp_path / "20260101-000008-zero"
    zero.mkdir()
    (zero / "summary.json").symlink_to("/dev/zero")
    write_run(tmp_path, "20260101-000009-baseline", json.dumps(summary("20260101-000009-baseline")))
    got: list[object] = []
    reader = threading.Thread(target=lambda: got.append(load_runs(tmp_path)), daemon=True)
    reader.start()
    reader.join(10)
    try:
        assert not reader.is_alive(), "load_runs blocked on a FIFO in the runs dir"
    finally:  # free a reader stuck in open() (the old code): a writer end opens and closes
        if reader.is_alive():
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert [r.run_id for r in got[0]] == ["20260101-000009-baseline"]  # type: ignore[union-attr]


def test_the_bounded_reader_refuses_what_is_not_a_small_regular_file(tmp_path: Path) -> None:
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "target.json")
    (tmp_path / "target.json").write_text('{"a": 1}')
    assert read_json_object(tmp_path / "target.json") == {"a": 1}
    assert read_json_object(link) is None  # not through a link at the last component
    (tmp_path / "big.json").write_text('{"a": "' + "x" * 100 + '"}')
    assert read_json_object(tmp_path / "big.json", limit=50) is None
    assert read_text(tmp_path / "big.json", limit=50) is None
    assert json_depth(b'{"a": "[[[[", "b": [[1]]}') == 3  # brackets inside strings do not count
    assert json_depth(b"[" * 1000, limit=64) == 65


@pytest.mark.parametrize("bad", [{"model": ["a"]}, {"status": 3}, {"world_size": True}, {"run_id": {"x": 1}},
                                 {"config": {"nproc": {"deep": 1}, "preset": ["x"]}}])
def test_a_field_of_any_type_is_a_row_not_a_crash(tmp_path: Path, bad: dict[str, object]) -> None:
    write_run(tmp_path, "20260101-000000-x", json.dumps({**summary("20260101-000000-x"), **bad}))
    (row,) = load_runs(tmp_path)
    cells = build_table([row]).cells(row)
    assert all(isinstance(c, str) for c in cells)


@pytest.mark.e2e
@pytest.mark.slow  # ~40 s on the 2-core box; the quick guard of case 1 is the runs tab test above
def test_a_viewer_that_fails_leaves_its_owned_run_going_and_says_so(tmp_path: Path, live: Path) -> None:  # noqa: F811
    """Not a quit and not a lost terminal (those stop an owned run): an exception inside the
    TUI. The supervisor is told, logs who, and the run goes on detached."""

    async def owner() -> tuple[str, int, str]:
        app = build_app(cpu_config(steps=100000), tmp_path)
        with pytest.raises(ZeroDivisionError):
            async with app.run_test(size=(80, 24)) as pilot:
                session = app.workbench.current
                await wait_for(pilot, lambda: all(rs.last_step > 2 for rs in session.state.ranks.values())
                               and len(session.state.ranks) == 2, START_TIMEOUT, "both ranks stepping")
                app.call_later(lambda: 1 / 0)  # a bug of the viewer's own
                await wait_for(pilot, lambda: not app.is_running, 10, "the TUI to end")
        return session.run_id, session.pid, app.exit_note

    run_id, pid, note = asyncio.run(owner())
    assert note == (f"the viewer failed (ZeroDivisionError: division by zero); run {run_id} goes on "
                    f"detached: ddptop attach {run_id}")
    entry = wait_until(lambda: (e := entry_of(run_id, live)) and e.detached and e, 10, "the run detached")
    step = entry.step
    wait_until(lambda: (e := entry_of(run_id, live)) and e.step > step + 5, 30, "steps after the viewer failed")
    pids = tree(pid)
    os.kill(pid, signal.SIGTERM)  # the clean stop of a detached run
    wait_gone(pids, 30)
    log = (tmp_path / run_id / "supervisor.log").read_text()
    assert "its owner viewer crashed (ZeroDivisionError: division by zero)" in log
    assert "its owner viewer disconnected" not in log
