"""Attaching to a frozen supervisor (issue 33.8): the kernel still accepts the connection,
but no welcome comes; the views say the supervisor is not answering, not 'waiting for ranks'."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

from rich.console import Console

from ddptop.model.snapshot import snapshot
from ddptop.remote.live import LiveRun
from ddptop.remote.viewer import NOT_ANSWERING_S, RemoteSession
from ddptop.tui.widgets.run_header import _rates


def test_a_supervisor_that_does_not_answer_is_said_to_be_not_answering() -> None:
    live = Path(tempfile.mkdtemp(prefix="df", dir="/tmp"))
    server = socket.socket(socket.AF_UNIX)  # listens, never reads: a SIGSTOPped supervisor
    try:
        server.bind(str(live / "frozen00.sock"))
        server.listen(4)
        entry = LiveRun(run_id="frozen", pid=os.getpid(), socket=str(live / "frozen00.sock"), token="t",
                        run_dir="/d", runs_dir="/", preset="baseline", world_size=2, detached=True,
                        started_at=time.time())
        session = RemoteSession.attach(entry, live)

        async def main() -> tuple[str, str]:
            runner = asyncio.create_task(session.run())
            await asyncio.sleep(0.5)
            before = session.state.error
            await asyncio.sleep(NOT_ANSWERING_S + 0.5)
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
            return before, session.state.error

        before, after = asyncio.run(main())
        assert before == ""
        assert after == f"the supervisor (pid {os.getpid()}) is not answering"
        session.state.error = after
        console = Console(width=200, record=True)
        console.print(_rates(snapshot(session.state, time.time())))
        text = console.export_text()
        assert "is not answering" in text and "waiting for ranks" not in text
    finally:
        server.close()
        shutil.rmtree(live, ignore_errors=True)
