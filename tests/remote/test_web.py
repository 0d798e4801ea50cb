"""`ddptop attach --web` behind its secret: the real aiohttp server of ddptop.remote.web on a free
port, a real HTTP client and websocket, and a stand-in viewer process (a few lines of
Python speaking textual-serve's packets) so each test takes well under a second. Without
the token or its cookie, or from a foreign Origin, nothing is served and no viewer starts;
a read-only app refuses every key that would change the run. The end-to-end path (a real
run, `ddptop attach --web --read-only`, `x` over the websocket) is in test_detach.py."""

from __future__ import annotations

import asyncio
import re
import shlex
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import psutil
import pytest
from aiohttp import web
from test_detach import free_port

from ddptop.remote.web import WebServer, cookie_name, new_token
from ddptop.tui.app import DdpTopApp
from ddptop.tui.synthetic import StaticSession, synthetic_state, synthetic_workbench

# textual-serve's side of a viewer: the prelude, one data packet, then packets in until "quit".
FAKE_VIEWER = r"""
import sys
with open(sys.argv[1], "a") as f:
    f.write("started\n")
out, inp = sys.stdout.buffer, sys.stdin.buffer
out.write(b"__GANGLION__\n" + b"D" + (6).to_bytes(4, "big") + b"screen")
out.flush()
while len(head := inp.read(5)) == 5:
    body = inp.read(int.from_bytes(head[1:], "big"))
    if head[:1] == b"M" and b'"quit"' in body:
        break
with open(sys.argv[1], "a") as f:
    f.write("ended\n")
"""


@dataclass
class Served:
    server: WebServer
    base: str  # http://127.0.0.1:PORT, also the page's Origin
    started: Path  # one line per viewer process started

    def viewers(self, what: str = "started") -> int:
        return self.started.read_text().split().count(what) if self.started.exists() else 0

    async def ended(self, n: int, timeout: float = 5.0) -> None:
        for _ in range(int(timeout / 0.1)):
            if self.viewers("ended") >= n:
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"{n} viewer(s) did not end within {timeout:.0f}s")


@asynccontextmanager
async def serving(tmp_path: Path) -> AsyncIterator[Served]:
    port = free_port()
    started = tmp_path / "viewers"
    server = WebServer(shlex.join([sys.executable, "-c", FAKE_VIEWER, str(started)]), port, new_token(),
                       title="ddptop test")
    runner = web.AppRunner(await server.make_app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    before = {p.pid for p in psutil.Process().children()}
    try:
        yield Served(server, f"http://127.0.0.1:{port}", started)
    finally:
        await runner.cleanup()
        # Let the loop hear of its viewers' exits before it closes (else asyncio complains).
        for _ in range(50):
            if not {p.pid for p in psutil.Process().children()} - before:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.05)


async def ws_status(http: aiohttp.ClientSession, url: str, **kw: object) -> int:
    """The websocket upgrade's answer: 101 when it opened (then closed again)."""
    try:
        async with http.ws_connect(url, **kw) as ws:
            await ws.close()
            return 101
    except aiohttp.WSServerHandshakeError as exc:
        return exc.status


def test_without_the_token_page_assets_and_websocket_are_refused(tmp_path: Path) -> None:
    async def main() -> None:
        async with serving(tmp_path) as s, aiohttp.ClientSession() as http:
            for path in ("/", "/?token=", "/?token=" + "A" * 43, "/static/js/textual.js",
                         "/static/fonts/RobotoMono-VariableFont_wght.ttf", "/download/x"):
                async with http.get(s.base + path) as resp:
                    assert resp.status == 403, path
                    assert "set-cookie" not in resp.headers
                    assert "token" in await resp.text()  # says what to open instead
            wrong = {"Cookie": f"{cookie_name(s.server.port)}={'A' * 43}"}
            async with http.get(s.base + "/", headers=wrong) as resp:
                assert resp.status == 403
            assert await ws_status(http, s.base + "/ws?width=80&height=24", origin=s.base) == 403
            assert await ws_status(http, s.base + "/ws", origin=s.base, headers=wrong) == 403
            await asyncio.sleep(0.2)
            assert s.viewers() == 0  # refused before any viewer process started

    asyncio.run(main())


def test_the_token_url_sets_a_strict_cookie_and_the_cookie_alone_lets_in(tmp_path: Path) -> None:
    async def main() -> None:
        async with serving(tmp_path) as s:
            token, name = s.server.token, cookie_name(s.server.port)
            assert s.server.url == f"{s.base}/?token={token}" and len(token) >= 43
            async with aiohttp.ClientSession() as http, http.get(s.server.url) as resp:
                assert resp.status == 200
                cookie = resp.headers["Set-Cookie"]
                assert cookie.startswith(f"{name}={token};")
                assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
                assert resp.headers["Referrer-Policy"] == "no-referrer"
                assert "frame-ancestors 'none'" in resp.headers["Content-Security-Policy"]
                page = await resp.text()
            # Nothing from outside this machine: the font comes from the server's own static files.
            assert re.findall(r"https?://[^\s\"']+", page) == ["http://www.w3.org/2000/svg"]
            assert "fonts/RobotoMono-VariableFont_wght.ttf" in page
            assert f'data-session-websocket-url="ws://127.0.0.1:{s.server.port}/ws"' in page

            # A later request (an asset, the websocket) with the cookie only, as a browser sends it.
            jar = {"Cookie": f"{name}={token}"}
            async with aiohttp.ClientSession(headers=jar) as http:
                for path in ("/", "/static/js/textual.js", "/static/fonts/RobotoMono-VariableFont_wght.ttf"):
                    async with http.get(s.base + path) as resp:
                        assert resp.status == 200, path
                async with http.get(s.base + "/", headers={"Host": f"localhost:{s.server.port}"}) as resp:
                    # opened as localhost: the websocket goes there too (where the cookie is)
                    assert f"ws://localhost:{s.server.port}/ws" in await resp.text()
                async with http.ws_connect(s.base + "/ws?width=80&height=24", origin=s.base) as ws:
                    msg = await ws.receive(timeout=10)
                    assert msg.type == aiohttp.WSMsgType.BINARY and msg.data == b"screen"
            assert s.viewers() == 1
            await s.ended(1)  # closing the page ends its viewer (textual-serve says "quit")

    asyncio.run(main())


def test_a_foreign_origin_or_host_is_refused_even_with_the_cookie(tmp_path: Path) -> None:
    async def main() -> None:
        async with serving(tmp_path) as s:
            port = s.server.port
            jar = {"Cookie": f"{cookie_name(port)}={s.server.token}"}
            async with aiohttp.ClientSession(headers=jar) as http:
                ws = s.base + "/ws?width=80&height=24"
                # Any web page in the owner's browser: another site, or another port of this
                # host (same-site, so the browser sends the cookie along).
                for origin in ("http://evil.example", f"http://evil.example:{port}", "null",
                               f"http://127.0.0.1:{port + 1}", f"https://127.0.0.1:{port}"):
                    assert await ws_status(http, ws, origin=origin) == 403, origin
                    async with http.get(s.base + "/", headers={"Origin": origin}) as resp:
                        assert resp.status == 403, origin
                # A name rebound to 127.0.0.1 (DNS rebinding): not this machine's page.
                async with http.get(s.base + "/", headers={"Host": f"evil.example:{port}"}) as resp:
                    assert resp.status == 403
                # A state-changing request must come from the page itself.
                async with http.post(s.base + "/") as resp:
                    assert resp.status == 403
                await asyncio.sleep(0.2)
                assert s.viewers() == 0
                # The page's own origins pass (through a forwarded port of the same number).
                assert await ws_status(http, ws, origin=f"http://localhost:{port}") == 101
                await s.ended(1)

    asyncio.run(main())


@dataclass
class LiveSession(StaticSession):
    """A run that is live as far as the app can tell; records the stops it is asked for."""

    done: bool = False
    stops: list[str] | None = None

    def request_stop(self, reason: str = "") -> None:
        self.stops = [*(self.stops or []), reason]


def live_app(tmp_path: Path, **kw: object) -> tuple[DdpTopApp, LiveSession]:
    state = synthetic_state(2)
    bench = synthetic_workbench(state, tmp_path)
    session = LiveSession(state, state.config, tmp_path / state.run_id)
    bench.sessions[-1] = session  # type: ignore[call-overload]
    return DdpTopApp(bench, autostart=False, refresh_s=3600, **kw), session  # type: ignore[arg-type]


def test_a_read_only_viewer_refuses_stop_restart_settings_detach_and_capture(tmp_path: Path) -> None:
    async def main() -> None:
        app, session = live_app(tmp_path, read_only=True, viewer="web")
        async with app.run_test(size=(120, 40)) as pilot:
            assert app.workbench.is_live()
            for key in ("x", "R", "s", "d", "c"):
                await pilot.press(key)
                await pilot.pause()
                assert app.screen is app.screen_stack[0], key  # no settings screen, no question
            said = [n.message for n in app._notifications]
            for what in ("stop the run", "start a run", "change settings", "detach the run", "capture"):
                assert f"read-only view: cannot {what}" in said
            assert session.stops is None and len(app.workbench.sessions) == 1  # nothing restarted
            await pilot.press("q")  # a watcher just leaves: no "detach or stop?"
            await pilot.pause()
            assert not app.is_running
        assert session.stops is None

    asyncio.run(main())


@pytest.mark.parametrize("viewer, reason", [("web", "stopped by user, from a web viewer"),
                                            ("", "stopped by user")])
def test_a_stop_says_which_kind_of_viewer_asked(tmp_path: Path, viewer: str, reason: str) -> None:
    async def main() -> list[str] | None:
        app, session = live_app(tmp_path, viewer=viewer)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("x")
            await pilot.press("y")  # `x` asks first on a live run
            await pilot.pause()
        return session.stops

    assert asyncio.run(main()) == [reason]
