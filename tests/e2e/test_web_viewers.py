"""`ddptop attach --web` leaves nothing behind (issue 17): pages whose websocket closes
at any moment, even before their viewer has drawn anything, leave no `ddptop attach`
process; and a page opened after the run ended says so in the browser."""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp
import psutil
import pytest
from test_detach import (
    entry_of,
    free_port,
    live,  # noqa: F401  (a fixture)
)
from test_pty import Census, detached_sleeper, stop_run
from waiting import wait_until as until

PAGES = 20
VIEWERS_GONE_S = 10.0


class WebServer:
    """`ddptop attach --web RUN_ID` on a free port, its console kept."""

    def __init__(self, run_id: str, ddptop: tuple[str, ...] = (sys.executable, "-m", "ddptop"), cwd: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen([*ddptop, "attach", "--web", "--port", str(self.port),
                                      run_id], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=cwd, env=env)
        self.out: list[str] = []
        threading.Thread(target=lambda: self.out.extend(line.decode() for line in self.proc.stdout),
                         daemon=True).start()
        self.url = str(until(lambda: next((w for line in self.out for w in line.split() if "?token=" in w), None),
                             30, "the token URL"))
        self.census = Census(self.proc.pid)

    def viewers(self) -> list[str]:
        """The server's viewer processes (`ddptop attach` without --web), wherever they are now."""
        return [p for p in self.census.alive() if " attach " in p and "--web" not in p]

    async def page(self, hold_s: float, read_until: bytes = b"") -> bytes:
        """A browser page: the cookie, then the websocket, closed after `hold_s` (or once
        the screen shows `read_until`)."""
        base = f"http://127.0.0.1:{self.port}"
        screen = b""
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            async with http.get(self.url) as resp:
                assert resp.status == 200
            async with http.ws_connect(f"{base}/ws?width=100&height=30", origin=base) as ws:
                deadline = time.monotonic() + hold_s
                while time.monotonic() < deadline and not (read_until and read_until in screen):
                    with contextlib.suppress(asyncio.TimeoutError):
                        msg = await ws.receive(timeout=max(0.01, deadline - time.monotonic()))
                        if msg.type == aiohttp.WSMsgType.BINARY:
                            screen += msg.data
                        elif msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
                            break
        return screen

    def close(self) -> list[str]:
        """Ctrl-C, as its user would; what of it is left after 10 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(15)
        left: list[str] = []
        with contextlib.suppress(AssertionError):
            until(lambda: not self.census.alive(), VIEWERS_GONE_S, "the server's processes")
        left = self.census.alive()
        self.census.stop()
        for line in left:
            with contextlib.suppress(psutil.Error):
                psutil.Process(int(line.split()[0])).kill()
        self.proc.kill()
        return left


@pytest.mark.e2e
@pytest.mark.slow  # the suite stays under 10 min on 2 cores: `pytest -m slow` runs it (covered: the web tests' single page)
def test_pages_that_close_at_any_moment_leave_no_viewer_process(tmp_path: Path, live: Path) -> None:  # noqa: F811
    run_id = detached_sleeper(tmp_path)
    server = WebServer(run_id)
    try:
        async def pages() -> None:
            rng = random.Random(17)
            for _ in range(PAGES // 5):  # five browsers at a time, as tabs opened and closed
                await asyncio.gather(*(server.page(rng.uniform(0.1, 1.0)) for _ in range(5)))

        t0 = time.monotonic()
        asyncio.run(pages())
        print(f"\n{PAGES} pages opened and closed in {time.monotonic() - t0:.1f}s, "
              f"{sum(1 for p in server.census.seen.values())} processes seen")
        t1 = time.monotonic()
        until(lambda: not server.viewers(), VIEWERS_GONE_S, f"the viewers to end: {server.viewers()}")
        print(f"every viewer gone {time.monotonic() - t1:.1f}s after the last page closed")
        assert server.proc.poll() is None  # the server itself serves on
        until(lambda: (e := entry_of(run_id, live)) and e.viewers == 0, 5, "the supervisor to count none")
        assert entry_of(run_id, live).status in ("starting", "running")
    finally:
        left = server.close()
        stop_run(run_id, live)
    assert left == []


@pytest.mark.e2e
def test_a_page_opened_after_the_run_ended_says_so(tmp_path: Path, live: Path) -> None:  # noqa: F811
    run_id = detached_sleeper(tmp_path)
    server = WebServer(run_id)
    try:
        stop_run(run_id, live)
        screen = asyncio.run(server.page(15, read_until=b"has ended"))
        assert f"run {run_id} has ended".encode() in screen, screen[-500:]
        assert f"its records: {tmp_path.resolve() / run_id}".encode() in screen  # where to see it again
        until(lambda: not server.viewers(), VIEWERS_GONE_S, "the page's viewer to end")
    finally:
        left = server.close()
    assert left == []
