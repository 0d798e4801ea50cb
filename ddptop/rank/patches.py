"""Where the instrument wraps torch and sys: GradScaler.step, DistributedDataParallel's
construction and comm hook registration, destroy_process_group, sys.excepthook,
sys.exit and os._exit. Each wrapper calls the instrument's callbacks and then does what the original
does; a function wrapped once is not wrapped again (`_ddptop` on it)."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any


def _mark(fn: Any) -> None:
    fn._ddptop = True


def _wrapped(fn: Any) -> bool:
    return bool(getattr(fn, "_ddptop", False))


def wrap_grad_scaler(torch: Any, before: Callable[[Any], None], after: Callable[[Any], None]) -> None:
    """`before(optimizer)`/`after(optimizer)` around GradScaler.step: a step that GradScaler
    skips (inf/NaN gradients) is still the script's step."""
    amp = getattr(torch, "amp", None)
    scaler = getattr(amp, "GradScaler", None)
    if scaler is None or _wrapped(scaler.step):
        return
    original = scaler.step

    @functools.wraps(original)
    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        before(optimizer)
        try:
            return original(self, optimizer, *args, **kwargs)
        finally:
            after(optimizer)

    _mark(step)
    scaler.step = step


def wrap_compile(torch: Any, on_module: Callable[[Any], None]) -> None:
    """torch.compile: `on_module(compiled)` when it wraps a module (in an OptimizedModule)."""
    original = getattr(torch, "compile", None)
    if original is None or _wrapped(original):
        return

    @functools.wraps(original)
    def compile(model: Any = None, *args: Any, **kwargs: Any) -> Any:  # noqa: A001 - torch's name
        compiled = original(model, *args, **kwargs)
        if isinstance(model, torch.nn.Module) and compiled is not model:
            on_module(compiled)
        return compiled

    _mark(compile)
    torch.compile = compile


def wrap_spawn(torch: Any, note: Callable[[str], None]) -> None:
    """torch.multiprocessing.spawn / start_processes in a rank: the training they start runs in
    children ddptop does not measure (it attaches to the processes torchrun starts); say so, with
    the function and how many, before they start (issue 43)."""
    mp = getattr(torch, "multiprocessing", None)
    for name in ("spawn", "start_processes"):
        original = getattr(mp, name, None)
        if original is None or _wrapped(original):
            continue

        def started(fn: Any, *args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
            nprocs = kwargs.get("nprocs", args[1] if len(args) > 1 else 1)
            note(f"{getattr(fn, '__qualname__', fn)!s:.60} runs in {nprocs} torch.multiprocessing.{_name} "
                 "child process(es): ddptop measures the processes torchrun starts, not their children, "
                 "so their steps are not counted")
            return _original(fn, *args, **kwargs)

        functools.update_wrapper(started, original)
        _mark(started)
        setattr(mp, name, started)


def wrap_ddp(ddp_class: Any, change_args: Callable[..., Any], on_init: Callable[[Any], None],
             on_register: Callable[..., Any], on_builtin: Callable[..., Any]) -> Any:
    """DDP's __init__ (`change_args(init, ddp, args, kwargs)` may give other arguments;
    `on_init(ddp)` after), register_comm_hook (`on_register(ddp, state, hook, original)`)
    and _register_builtin_comm_hook (`on_builtin(ddp, comm_hook_type, original)`). Returns
    DDP's own register_comm_hook (None when DDP was wrapped already)."""
    if _wrapped(ddp_class.__init__):
        return None
    init, register, builtin = ddp_class.__init__, ddp_class.register_comm_hook, ddp_class._register_builtin_comm_hook

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        change = change_args(init, self, args, kwargs)
        if change is not None:
            args, kwargs = change
        init(self, *args, **kwargs)
        on_init(self)

    @functools.wraps(register)
    def register_comm_hook(self: Any, state: Any, hook: Any) -> Any:
        return on_register(self, state, hook, register)

    @functools.wraps(builtin)
    def register_builtin(self: Any, comm_hook_type: Any) -> Any:
        return on_builtin(self, comm_hook_type, builtin)

    _mark(__init__)
    ddp_class.__init__ = __init__
    ddp_class.register_comm_hook = register_comm_hook
    ddp_class._register_builtin_comm_hook = register_builtin
    return register


def wrap_destroy(dist: Any, before: Callable[[], None], left: Callable[[], bool],
                 after: Callable[[], None] = lambda: None) -> None:
    """`before()` ahead of destroy_process_group; a no-op when `left()` (the instrument
    destroyed the group already) and no group is left. `after()` once no group is left: the
    instrument lets go of the script's DDPs then, so their groups are freed when the script
    lets go of them, as without ddptop (a gloo group torn down after its peer has left can
    abort the process: "terminate called without an active exception" under load)."""
    original = getattr(dist, "destroy_process_group", None)
    if original is None or _wrapped(original):
        return

    @functools.wraps(original)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        before()
        if left() and not dist.is_initialized():
            return None
        out = original(*args, **kwargs)
        if not dist.is_initialized():
            after()
        return out

    _mark(destroy_process_group)
    dist.destroy_process_group = destroy_process_group


def chain_excepthook(on_exception: Callable[[BaseException], None]) -> None:
    """`on_exception(exc)` for an uncaught exception other than SystemExit, then the hook
    there was."""
    previous = sys.excepthook

    def hook(*exc_info: Any) -> None:
        if not issubclass(exc_info[0], SystemExit):
            on_exception(exc_info[1])
        previous(*exc_info)

    sys.excepthook = hook


def watch_exit(on_status: Callable[[Any], None]) -> None:
    """`on_status(status)` with what the script passes to sys.exit()."""
    original = sys.exit

    def exit(status: Any = None) -> Any:
        on_status(status)
        return original(status)

    sys.exit = exit


def wrap_os_exit(before: Callable[[int], None]) -> None:
    """`before(status)` ahead of os._exit, which skips atexit: a rank that leaves that way
    still sends its last steps and its goodbye. A forked child's os._exit (mp.Pool's
    workers end so) reaches `before` too: it must do nothing there."""
    original = os._exit
    if _wrapped(original):
        return

    def _exit(status: int) -> Any:
        try:
            before(status)
        except BaseException:  # noqa: BLE001, S110 - leaving now, whatever happens
            pass
        original(status)

    _mark(_exit)
    os._exit = _exit
