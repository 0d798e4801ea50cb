"""The one way ddptop's run loops answer signals (headless, sweep and tune, a worker node, the
supervisor): handlers on the asyncio loop for as long as a block runs, removed after it, so
the next run of a sweep, or the caller, gets the default handling back."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator, Mapping

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def on_signals(handlers: Mapping[int, Callable[[str], object]]) -> Iterator[None]:
    """Call `handlers[sig](name)` (e.g. "SIGTERM") on the running loop while the block runs."""
    loop = asyncio.get_running_loop()
    for sig, handler in handlers.items():
        loop.add_signal_handler(sig, handler, signal.Signals(sig).name)
    try:
        yield
    finally:
        for sig in handlers:
            loop.remove_signal_handler(sig)
