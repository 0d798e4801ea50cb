"""How a rank leaves at the agreed step: what Ctrl-C would have given the script (the user's
stop), or a quiet SystemExit(0) together with its peers (the run's own step limit).

Standard library only; torch is passed in. Called at a step boundary, in the thread that
ran the optimizer step (the script's training thread).
"""

from __future__ import annotations

import _thread
import functools
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any


def ctrl_c() -> None:
    """What a Ctrl-C would have given the script, here and now: its own SIGINT handler
    called (Python's default one raises KeyboardInterrupt, so `except KeyboardInterrupt:`
    blocks and `finally:` run). SIGINT ignored or left to the OS: the script's own SIGTERM
    handler if it has one, else SystemExit(0). Whatever the handler raises goes to the
    script, as it would from a real signal.

    In the main thread, inside a hook wrapped by `armed_after`, the handler runs for a SIGINT
    armed as the hook returns and handled once back in torch's code: the script's
    KeyboardInterrupt then comes from torch's optimizer step, no frame of ddptop's in it."""
    frame = sys._getframe(1)
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        if _PENDING is not None and threading.current_thread() is threading.main_thread() and _IN_HOOK:
            _DUE.append(_PENDING)
            return
        absorb_next_sigint()
        handler(signal.SIGINT, frame)
        return
    term = signal.getsignal(signal.SIGTERM)
    if callable(term):
        term(signal.SIGTERM, frame)
        return
    raise SystemExit(0)


_DUE: list[Any] = []  # the SIGINT ctrl_c left for armed_after to arm
_IN_HOOK: list[bool] = []  # inside a hook armed_after wraps


def armed_after(hook: Callable[..., Any]) -> Callable[..., Any]:
    """`hook` (the optimizer step's post hook), then the SIGINT that `ctrl_c` left due, armed by
    reading two attributes (`_pending`): the interpreter checks for signals after a call, not a
    read, so the script's handler runs at the first check back in torch's code."""

    def run(*args: Any, **kwargs: Any) -> Any:
        _IN_HOOK.append(True)
        try:
            result = hook(*args, **kwargs)
        finally:
            _IN_HOOK.pop()
        if _DUE:
            pending = _DUE.pop()
            pending.absorb_next  # noqa: B018 - reads, not calls
            pending.sigint  # noqa: B018
        return result

    return run


def absorb_next_sigint() -> None:
    """The rank stops at the agreed step: the SIGINT that ddptop sends through torchrun a moment
    later (where the run has not ended by then) is this same Ctrl-C, not a second one, so it
    must not interrupt the handler now running (a checkpoint's save). The next SIGINT is
    absorbed and the script's own handler put back. Only the main thread may set handlers."""
    handler = signal.getsignal(signal.SIGINT)

    def absorbed(signum: int, frame: Any) -> None:  # noqa: ARG001
        signal.signal(signal.SIGINT, handler)

    try:
        signal.signal(signal.SIGINT, absorbed)
    except (ValueError, TypeError):  # not the main thread; a handler set outside Python
        pass


def _absorb_later(_: Any) -> int:  # a pending call (C): must not raise
    try:
        absorb_next_sigint()
    except Exception:  # noqa: BLE001
        pass
    return 0


def _pending() -> Any:
    """SIGINT, as an int whose two attributes act when read: `sigint` simulates the signal (its
    handler runs at the interpreter's next check for signals), `absorb_next` queues
    `absorb_next_sigint` as a pending call (run at a check after that: signals come first).
    Reads, because the interpreter checks for signals after every call: a call here would
    run the script's handler inside ddptop's frames, a read leaves it to the first check
    after the hooks have returned (in torch's optimizer step). None where ctypes cannot."""
    try:
        import ctypes

        add = ctypes.pythonapi.Py_AddPendingCall
        callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(_absorb_later)
        add.argtypes = [type(callback), ctypes.c_void_p]
    except (ImportError, AttributeError):
        return None

    class _Pending(int):
        sigint = property(_thread.interrupt_main)  # not signal.raise_signal: it handles the signal at once
        absorb_next = property(functools.partial(add, callback))
        keep = callback  # the C callback lives as long as the class

    return _Pending(signal.SIGINT)


_PENDING = _pending()


def limit_reached(rank: int, step: int, why: str) -> None:
    """The run's step limit (`--steps` on a script, a sweep's runs, cost_ab's blocks): the
    script is cut short by ddptop, not interrupted by its user, so it ends as a finished
    program does (SystemExit(0)); one line says why on its stderr."""
    print(f"ddptop: rank {rank} stops after step {step}, {why}", file=sys.stderr, flush=True)
    raise SystemExit(0)


def leave_together(torch: Any) -> bool:
    """Every rank stops at the same step of its own accord (the step limit): they leave the
    process group together, as a script that ends cleanly does (a gloo rank whose peer has
    already gone can abort at exit). True when the group was destroyed here."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return False
    dist.barrier()
    dist.destroy_process_group()
    return True


def agreed_step(stop_at: int | None, limit: int | None) -> tuple[int | None, bool]:
    """The step the rank stops after: the run's own limit (a script's steps, cost_ab's blocks)
    when it comes first or together with the user's stop, else the user's stop (None: not
    agreed yet); True when it is the limit (the run then completes rather than stops)."""
    if limit is not None and (stop_at is None or limit <= stop_at):
        return limit, True
    return stop_at, False
