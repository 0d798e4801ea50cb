"""Headless front end: a status line every few seconds, a final per-rank table,
and the summary as JSON on request. For CI, scripts, and no-TTY shells."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import TextIO

from ddptop.hw.terminal import output_width
from ddptop.model import report
from ddptop.model.exit_codes import EXIT_CODES
from ddptop.model.report import closing_lines
from ddptop.run.session import Session
from ddptop.run.signals import STOP_SIGNALS, on_signals


async def run_headless(session: Session, interval: float = 3.0, as_json: bool = False,
                       out: TextIO = sys.stdout) -> int:
    loop = asyncio.get_running_loop()

    def stop(name: str) -> None:  # each a Ctrl-C of torchrun's: the second one escalates
        if session.stop_requested:
            said = session.escalate_stop(f"signal {name}")
            if said:
                print(f"ddptop: {said}", file=out, flush=True)
        else:
            session.request_stop(f"signal {name}")

    handlers: dict[int, Callable[[str], object]] = dict.fromkeys(STOP_SIGNALS, stop)
    # `kill -USR1 <pid>` on a live headless run captures the next 3 steps on every rank
    handlers[signal.SIGUSR1] = lambda _: loop.create_task(session.request_capture(3))
    print(f"ddptop: run {session.run_id}  preset {session.config.preset}  "
          f"{session.state.world_size} rank(s)  records in {session.run_dir}  "
          f"(pid {os.getpid()}: kill -USR1 to capture)", file=out, flush=True)
    with on_signals(handlers):
        runner = asyncio.create_task(session.run())
        while not runner.done():
            await asyncio.wait({runner}, timeout=interval)
            if not runner.done():
                stopping = session.stopper.progress  # who is still in their handlers, and how long
                print(report.status_line(session.state, time.time()) + (f"  {stopping}" if stopping else ""),
                      file=out, flush=True)
        state = runner.result()
    summary = state.summary()
    print(closing_lines(state, session.run_dir, summary, *output_width(out)), file=out, flush=True)
    if as_json:
        print(json.dumps(summary, separators=(",", ":")), file=out, flush=True)
    return EXIT_CODES[state.status]
