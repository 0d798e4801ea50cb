"""`ddptop attach --web`: textual-serve's server for one run, behind a secret of this
server (a Jupyter-style token URL, then an HttpOnly cookie), an Origin check, and a page
that loads nothing from outside the machine. No Textual app and no torch here: each
page's viewer is a `ddptop attach` process that textual-serve starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import secrets
from asyncio.subprocess import Process
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp_jinja2
from aiohttp import WSMsgType, web
from textual_serve.app_service import AppService
from textual_serve.server import Server, to_int

from ddptop.model.text import printable
from ddptop.remote.live import PACKAGE_ROOT

HOST = "127.0.0.1"  # never a public interface: reach it through an SSH port forward
LOOPBACK = ("127.0.0.1", "localhost", "::1")
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
PAGE = "web_page.html"  # beside this module: the stock page, with no Google Fonts link
QUIT_WAIT_S = 1.0  # a page's viewer, once the page is gone: "quit", then SIGTERM...
TERM_WAIT_S = 2.0  # ...then SIGKILL (a viewer holds nothing of the run's)

log = logging.getLogger("ddptop.remote.web")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def new_token() -> str:
    return secrets.token_urlsafe(32)


def cookie_name(port: int) -> str:
    # Browsers send a host's cookies to every port of it: one name per port keeps two
    # servers (and their secrets) apart.
    return f"ddptop-web-{port}"


def is_loopback(host: str) -> bool:
    """True for a Host header (or netloc) naming this machine's loopback, any port."""
    try:
        return (urlsplit(f"//{host}").hostname or "") in LOOPBACK
    except ValueError:
        return False


def _same(given: str | None, secret: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), secret.encode())


class ViewerService(AppService):
    """textual-serve's AppService whose viewer process ends with its page, however early
    the page goes (even before the viewer has drawn anything, when it cannot read "quit"
    yet): "quit", then SIGTERM, then SIGKILL, in bounded time. Stopping twice (a cancelled
    handler stops it again) waits for the same stop. The viewer runs with this ddptop's root
    first on PYTHONPATH, as the supervisor does; one that ends before drawing anything has its
    page say why (its stderr's end), not a splash that never loads (issue 46)."""

    _stopping: asyncio.Task[None] | None = None
    _drawn = False
    _stderr: bytearray | None = None

    def _build_environment(self, width: int = 80, height: int = 24) -> dict[str, str]:
        env = super()._build_environment(width, height)
        path = env.get("PYTHONPATH", "")
        env["PYTHONPATH"] = str(PACKAGE_ROOT) + (os.pathsep + path if path else "")
        return env

    async def _open_app_process(self, width: int = 80, height: int = 24) -> Process:
        process = await super()._open_app_process(width, height)
        if process.stderr is not None:  # what textual-serve's reader reads, kept for the page too
            self._stderr = bytearray()
            process.stderr = _Tee(process.stderr, self._stderr)  # type: ignore[assignment]
        return process

    async def on_data(self, payload: bytes) -> None:
        self._drawn = True
        await super().on_data(payload)

    async def run(self) -> None:
        try:
            await super().run()
        except asyncio.CancelledError:
            # textual-serve cancels its stderr reader, and awaits it, when the viewer is gone
            # at once; a reader cancelled before it ran raises here (not this task's cancel)
            task = asyncio.current_task()
            if task is None or getattr(task, "cancelling", lambda: 1)():
                raise
        if self._drawn or self._stopping is not None:
            return
        process = self._process
        if process is not None and process.stderr is not None:  # what the reader had no turn to read
            with contextlib.suppress(Exception):
                await asyncio.wait_for(process.stderr.read(), 2.0)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(process.wait(), 2.0)
        code = process.returncode if process is not None else None
        tail = bytes(self._stderr or b"").decode("utf-8", "replace").strip().splitlines()[-12:]
        lines = [f"ddptop: the viewer did not start (exit code {code}); the end of what it said:", "",
                 *(f"  | {line}" for line in tail or ["(nothing)"]), "",
                 "the run itself goes on; this server's console has the whole output."]
        text = "\r\n".join(f"  {printable(line)}" for line in ["", *lines])
        with contextlib.suppress(Exception):  # the page may be gone already
            await self.remote_write_bytes(f"\x1b[2J\x1b[H{text}\r\n".encode())

    async def stop(self) -> None:
        if self._task is None:
            return
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop())
        await asyncio.shield(self._stopping)

    async def _stop(self) -> None:
        await self._download_manager.cancel_app_downloads(app_service_id=self.app_service_id)
        await self.send_meta({"type": "quit"})
        process = self._process
        if process is not None:
            for end, wait_s in ((None, QUIT_WAIT_S), (process.terminate, TERM_WAIT_S), (process.kill, None)):
                if end is not None:
                    with contextlib.suppress(ProcessLookupError):
                        end()
                try:
                    await asyncio.wait_for(asyncio.shield(process.wait()), wait_s)
                    break
                except asyncio.TimeoutError:
                    continue
        if self._task is not None:
            await self._task  # its reader ends on the closed output
            self._task = None


class _Tee:
    """A stream reader whose reads are also kept in `kept` (the last 64 KiB)."""

    def __init__(self, reader: asyncio.StreamReader, kept: bytearray) -> None:
        self.reader, self.kept = reader, kept

    async def read(self, n: int = -1) -> bytes:
        data = await self.reader.read(n)
        self.kept += data
        del self.kept[:-65536]
        return data


class WebServer(Server):
    """textual-serve's Server, every request of which must carry the token (in the query,
    `?token=`, or in the cookie that the first such request sets) and, from a browser,
    come from this server's own page. Refusals are 403s, before any viewer starts."""

    def __init__(self, command: str, port: int, token: str, title: str,
                 ended: Callable[[], str] = lambda: "") -> None:
        super().__init__(command, host=HOST, port=port, title=title,
                         templates_path=Path(__file__).resolve().parent)
        self.token = token
        self.cookie = cookie_name(port)
        self.ended = ended  # '' while the run is live, else what a page should say instead

    @property
    def url(self) -> str:
        """What the user opens (it holds the secret: say it only to its owner)."""
        return f"http://{HOST}:{self.port}/?token={self.token}"

    async def make_app(self) -> web.Application:
        """The aiohttp application, guarded (what `serve()` runs; tests serve it too)."""
        return await self._make_app()

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        app.middlewares.append(self._guard)
        return app

    # --- who may come in --------------------------------------------------------------
    def refusal(self, request: web.Request) -> str:
        """Why `request` is refused ('' when it may go on)."""
        host = request.headers.get("Host", "")
        if not is_loopback(host):  # a DNS-rebound name: not a page of this server
            return f"Host {host!r} is not this machine's loopback address"
        origin = request.headers.get("Origin")
        # Browsers always send Origin on a websocket and on a POST; a missing one is a
        # script of the user's own (which still needs the token). A page of another port of
        # this host is same-site (the cookie goes along), so the Origin check is what stops it.
        if origin is not None or request.method not in SAFE_METHODS:
            allowed = {f"http://{name}:{self.port}" for name in ("127.0.0.1", "localhost")}
            allowed.add(f"http://{host.lower()}")  # the page itself, through `ssh -L OTHER:...`
            if (origin or "").lower() not in allowed:
                return f"Origin {origin!r} is not this server's page"
        if not (_same(request.query.get("token"), self.token)
                or _same(request.cookies.get(self.cookie), self.token)):
            return "no valid token"
        return ""

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        refusal = self.refusal(request)
        if refusal:
            log.warning("ddptop: refused %s %s: %s", request.method, request.path, refusal)
            raise web.HTTPForbidden(text=f"ddptop: refused ({refusal}). Open the URL with ?token=... "
                                         "that `ddptop attach --web` printed.\n")
        response = await handler(request)
        if not response.prepared:  # a websocket's headers are long gone by now
            if _same(request.query.get("token"), self.token):
                response.set_cookie(self.cookie, self.token, httponly=True, samesite="Strict", path="/")
            response.headers["Referrer-Policy"] = "no-referrer"  # the page's URL may hold the token
            response.headers["X-Content-Type-Options"] = "nosniff"
            if request.path == "/":
                response.headers["Cache-Control"] = "no-store"
                response.headers["X-Frame-Options"] = "DENY"  # no page may frame it and steer keys
                response.headers["Content-Security-Policy"] = (
                    "default-src 'self' 'unsafe-inline' 'unsafe-eval' data: blob:; "
                    f"connect-src 'self' ws://{request.host}; frame-ancestors 'none'; base-uri 'none'")
        return response

    # --- textual-serve's hooks --------------------------------------------------------
    @aiohttp_jinja2.template(PAGE)
    async def handle_index(self, request: web.Request) -> dict[str, Any]:
        # The websocket goes to the address the browser opened (127.0.0.1 or localhost, any
        # forwarded port), so the cookie set for that address goes with it.
        return {"font_size": to_int(request.query.get("fontsize", "16"), 16),
                "app_websocket_url": f"ws://{request.host}/ws", "static_url": "/static/",
                "title": self.title}

    def initialize_logging(self) -> None:
        super().initialize_logging()
        # The access log would print every `GET /?token=...` line.
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)

    async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
        """A page's viewer, while the run is live (textual-serve's handler, with a viewer
        that surely ends with its page); once the run has ended, no viewer (it would only
        fail, in this server's console) but the page says so itself."""
        websocket = web.WebSocketResponse(heartbeat=15)
        ended = self.ended()
        if not ended:
            service: ViewerService | None = None
            try:
                await websocket.prepare(request)
                async def close_page() -> None:
                    await websocket.close()

                service = ViewerService(self.command, write_bytes=websocket.send_bytes,
                                        write_str=websocket.send_str, close=close_page,
                                        download_manager=self.download_manager, debug=self.debug)
                await service.start(to_int(request.query.get("width", "80"), 80),
                                    to_int(request.query.get("height", "24"), 24))
                await self._process_messages(websocket, service)
            except asyncio.CancelledError:
                await websocket.close()
            except Exception as error:  # noqa: BLE001  (as textual-serve: logged, the server goes on)
                log.exception(error)
            finally:
                if service is not None:
                    await service.stop()
            return websocket
        await websocket.prepare(request)
        # printable: the note quotes the run's summary, and the page's terminal obeys escapes
        text = "\r\n".join(f"  {line}" for line in ["", *printable(ended, newlines=True).splitlines(), ""])
        await websocket.send_bytes(f"\x1b[2J\x1b[H{text}\r\n".encode())  # drawn by the page's terminal
        async for message in websocket:  # until the page goes; its pings answered as textual-serve does
            if message.type == WSMsgType.TEXT:
                with contextlib.suppress(ValueError, TypeError, IndexError):
                    envelope = json.loads(message.data)
                    if envelope[0] == "ping":
                        await websocket.send_json(["pong", envelope[1]])
        return websocket

    async def on_startup(self, app: web.Application) -> None:
        pass  # `ddptop attach --web` says where to go; textual-serve's URL has no token
