"""ddptop's hook into every Python process torchrun starts for a run: it runs the
sitecustomize this one shadows (if any), then lets ddptop's rank-side layer wait for torch.
Not under ddptop (no DDPTOP_ADDR), or with DDPTOP_BOOT=0, it does nothing else."""

import os
import sys


def _chain() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    dirs = [os.path.abspath(p or os.curdir) for p in sys.path]
    # only what stands after this one: the sitecustomize it shadows (two that chain each
    # other, ddptop's and `ddptop cost`'s stamp, must not find each other again)
    rest = sys.path[dirs.index(here) + 1:] if here in dirs else sys.path
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _boot() -> None:
    if not os.environ.get("DDPTOP_ADDR") or os.environ.get("DDPTOP_BOOT", "1") == "0":
        return
    try:
        from ddptop.rank.attach import watch

        watch()
    except Exception as exc:  # noqa: BLE001 - the user's script runs whatever happens here
        print(f"ddptop: not measuring this process: {type(exc).__name__}: {exc}", file=sys.stderr)


try:
    _chain()
finally:
    _boot()
