"""Hostile output (issue 33.1): whatever bytes a rank prints (terminal escapes, OSC 52
clipboard writes, Rich markup) are shown as text in the TUI's logs tab, the headless status
lines and failure report, and the web page's ended note; no ESC byte from a rank reaches
the user's terminal."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from textual.widgets import RichLog

from ddptop.model.config import RunConfig
from ddptop.model.report import final_report, status_line
from ddptop.model.state import RunState
from ddptop.model.text import printable
from ddptop.tui.factory import build_app
from ddptop.tui.widgets.log_view import format_line
from ddptop.wire.protocol import Hello, Info

HOSTILE = r"""
import sys
for out in (sys.stdout, sys.stderr):
    print("wipe\x1b[2J title\x1b]0;owned\x07 clip\x1b]52;c;aGk=\x07 [bold red]x[/] csi\x9b31m", file=out, flush=True)
raise RuntimeError("boom\x1b]52;c;aGk=\x07 [bold red]x[/]")
"""
SHOWN = ("^[[2J", "^[]0;owned^G", "^[]52;c;aGk=^G", "[bold red]x[/]", "csi\\x9b31m")


def test_printable_shows_control_characters_as_text_and_is_idempotent() -> None:
    raw = "\x1b[2J\x1b]0;t\x07\x1b]52;c;aGk=\x07 \x00\x7f\x9b \udc9b \u202e [b]x[/] a\tb\r\nc"
    shown = printable(raw)
    assert shown == "^[[2J^[]0;t^G^[]52;c;aGk=^G ^@^?\\x9b \ufffd <U+202E> [b]x[/] a\tb^M^Jc"
    assert printable(shown) == shown
    assert printable("a\r\nb", newlines=True) == "a^M\nb"
    assert printable("plain text") == "plain text"


def test_state_report_and_log_line_never_carry_a_ranks_escapes() -> None:
    state = RunState("r1", RunConfig(steps=10), world_size=1)
    state.add_log(0, "\x1b]52;c;aGk=\x07 [red]x[/]")
    state.finish("failed", time.time(), error="RuntimeError: \x1b[2J", failed_rank=0)
    assert list(state.logs[0]) == ["^[]52;c;aGk=^G [red]x[/]"]
    assert "\x1b" not in status_line(state, time.time())
    summary = state.summary()
    summary["failure_log"] = ["\x1b[2J raw from an old summary.json"]  # read back, not ingested
    report = final_report(summary, "/runs/r1")
    assert "\x1b" not in report and "^[[2J raw from an old summary.json" in report
    state.apply(Hello(rank=0, local_rank=0, world_size=1, host="h\x1b]0;t\x07", pid=1, token="k",
                      device="cpu\x1b[2J"), time.time())
    state.apply(Info(rank=0, facts={"model": "m\x1b[5m"}, notes=["n\x1b[2J"]), time.time())
    hello, info = state.ranks[0].hello, state.ranks[0].info
    assert hello is not None and (hello.host, hello.device) == ("h^[]0;t^G", "cpu^[[2J")
    assert info["model"] == "m^[[5m" and state.notes == ["rank 0: n^[[2J"]
    assert hello.model == "m^[[5m"  # the fact completes the hello (what the header shows) as text too
    line = format_line(0, "x\x1b[2J [bold]y[/]")  # a view on its own escapes too
    assert line.plain.endswith("x^[[2J [bold]y[/]") and not line.spans[1:]


@pytest.mark.e2e
def test_a_crashing_scripts_escapes_reach_the_headless_terminal_as_text(tmp_path: Path) -> None:
    script = tmp_path / "hostile.py"
    script.write_text(HOSTILE)
    res = subprocess.run([sys.executable, "-m", "ddptop", "--headless", "--json", "--runs-dir", str(tmp_path / "runs"),
                          "--nproc", "1", "--", sys.executable, str(script)], capture_output=True, timeout=120)
    out = res.stdout
    assert res.returncode == 1, out[-2000:] + res.stderr[-2000:]
    assert b"\x1b" not in out and b"\x07" not in out and b"\xc2\x9b" not in out
    text = out.decode()
    report, last = text.rsplit("\n", 2)[0], text.strip().splitlines()[-1]
    for shown in SHOWN:
        assert shown in report, (shown, report[-3000:])
    summary = json.loads(last)
    assert summary["status"] == "failed" and summary["failed_rank"] == 0
    assert any("^[]52;c;aGk=^G" in line for line in summary["failure_log"])
    assert "\x1b" not in summary["error"] and "boom^[]52;c;aGk=^G [bold red]x[/]" in summary["error"]


@pytest.mark.e2e
def test_the_logs_tab_shows_a_crashing_scripts_escapes_and_markup_as_text(tmp_path: Path) -> None:
    script = tmp_path / "hostile.py"
    script.write_text(HOSTILE)

    async def main() -> None:
        app = build_app(RunConfig(nproc=1), tmp_path / "runs", user_cmd=[sys.executable, str(script)],
                        in_process=True)
        async with app.run_test(size=(160, 40)) as pilot:
            deadline = time.monotonic() + 90
            while not (app.workbench.sessions and app.workbench.sessions[-1].state.finished):
                assert time.monotonic() < deadline, "the run did not end"
                await pilot.pause(0.2)
            await pilot.press("4")  # the logs tab
            app.refresh_views()
            await pilot.pause()
            log = app.query_one("#log", RichLog)
            rows = [strip.text for strip in log.lines]
            drawn = "\n".join(rows)
            for shown in SHOWN:
                assert shown in drawn, (shown, drawn[-3000:])
            assert not any("\x1b" in seg.text or "\x07" in seg.text for strip in log.lines for seg in strip)
            screen = "".join(seg.text for strip in app.screen._compositor.render_strips() for seg in strip)
            assert "\x1b" not in screen and "\x07" not in screen
            notes = [str(n.message) for n in app._notifications]
            assert any("[bold red]x[/]" in n for n in notes), notes  # the error: text, not markup

    asyncio.run(main())


def test_the_web_pages_ended_note_is_sent_as_text(tmp_path: Path) -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from ddptop.remote.web import WebServer

    async def main() -> None:
        server = WebServer("true", 0, "tok", "t", ended=lambda: "run ended (\x1b]52;c;aGk=\x07 [b]x[/])")
        app = await server.make_app()
        async with TestClient(TestServer(app)) as client:
            ws = await client.ws_connect("/ws?token=tok", headers={"Host": "127.0.0.1"})
            data = await ws.receive_bytes(timeout=5)
            await ws.close()
        assert data.startswith(b"\x1b[2J\x1b[H")  # the page's own clear, then only text
        body = data[len(b"\x1b[2J\x1b[H"):]
        assert b"\x1b" not in body and b"\x07" not in body
        assert "^[]52;c;aGk=^G [b]x[/]" in body.decode()

    asyncio.run(main())
