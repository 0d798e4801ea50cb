"""ddptop's hook into every Python process torchrun starts for a run: it runs the
sitecustomize this one shadows (if any), then lets ddptop's rank-side layer wait for torch.
Not under ddptop (no DDPTOP_ADDR), or with DDPTOP_BOOT=0, it does nothing else."""

import os
import sys


def _chain() -> None:
    from _ddptop_site_chain import chain  # beside this file, on the ranks' path

    chain(os.path.dirname(os.path.abspath(__file__)))


def _boot() -> None:
    if not os.environ.get("DDPTOP_ADDR") or os.environ.get("DDPTOP_BOOT", "1") == "0":
        return
    root = os.environ.get("DDPTOP_PACKAGE_ROOT")
    if root and root not in sys.path:
        sys.path.append(root)  # last: the script's own modules and site-packages come first
    try:
        from ddptop.rank.attach import watch

        watch()
    except Exception as exc:  # noqa: BLE001 - the user's script runs whatever happens here
        print(f"ddptop: not measuring this process: {type(exc).__name__}: {exc}", file=sys.stderr)


try:
    _chain()
finally:
    _boot()
