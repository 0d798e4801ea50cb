"""Issue 46 point 10, "must show" 2: `ddptop attach --web` started in a folder that holds an
unrelated `ddptop/` folder (the parent of a clone holds one) serves the live run: the page's
viewer imports this ddptop, not that folder (it died on `cannot import name '__version__'`
and the page stayed a splash); and a viewer that cannot start says why on the page."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from test_detach import live  # noqa: F401  (a fixture)
from test_pty import detached_sleeper, stop_run
from test_web_viewers import WebServer

ROOT = Path(__file__).resolve().parents[2]
# the server as the `ddptop` console script runs it: this ddptop importable, no PYTHONPATH,
# and nothing of the cwd on sys.path
SERVER = ("import sys; sys.path.remove('') if '' in sys.path else None; sys.path.insert(0, sys.argv.pop(1)); "
          "from ddptop.cli import main; sys.argv[0] = 'ddptop'; sys.exit(main())")


class ServerIn(WebServer):
    """`ddptop attach --web RUN_ID` started in `cwd`, without the tests' PYTHONPATH."""

    def __init__(self, run_id: str, cwd: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        super().__init__(run_id, (sys.executable, "-c", SERVER, str(ROOT)), cwd=cwd, env=env)


def unrelated_ddptop(tmp_path: Path) -> Path:
    here = tmp_path / "parent"
    (here / "ddptop" / "docs").mkdir(parents=True)  # a folder named ddptop, no package of ours
    (here / "ddptop" / "notes.txt").write_text("not the package\n")
    return here


@pytest.mark.e2e
def test_the_web_page_shows_the_live_run_from_a_folder_holding_an_unrelated_ddptop(
        tmp_path: Path, live: Path) -> None:  # noqa: F811
    run_id = detached_sleeper(tmp_path)
    server = ServerIn(run_id, unrelated_ddptop(tmp_path))
    try:
        screen = asyncio.run(server.page(40, read_until=run_id.encode()))
        assert run_id.encode() in screen, (screen[-800:], "".join(server.out)[-2000:])
        assert "cannot import name" not in "".join(server.out)
    finally:
        left = server.close()
        stop_run(run_id, live)
    assert left == []


def test_a_viewer_that_cannot_start_says_why_on_the_page() -> None:
    """The page's viewer, as the server runs it, exits at once with a message (a broken
    environment): the page gets that message, not a splash that never loads."""
    from ddptop.remote.web import ViewerService

    async def main() -> bytes:
        page = bytearray()

        async def write_bytes(data: bytes) -> None:
            page.extend(data)

        async def write_str(text: str) -> None:
            page.extend(text.encode())

        async def close() -> None:
            pass

        from textual_serve.download_manager import DownloadManager

        service = ViewerService("echo 'ImportError: no ddptop here' >&2; exit 3", write_bytes=write_bytes,
                                write_str=write_str, close=close, download_manager=DownloadManager())
        await service.start(80, 24)
        await asyncio.wait_for(service._task, 20)  # type: ignore[arg-type]
        return bytes(page)

    page = asyncio.run(main())
    assert b"the viewer did not start (exit code 3)" in page, page
    assert b"ImportError: no ddptop here" in page
