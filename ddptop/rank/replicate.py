"""Composable `replicate()` (torch.distributed._composable): DDP without the class. At the
replicated module's first forward, its pre-hook builds a DistributedDataParallel around a
ParameterList of the module's parameters and from then on calls that DDP's _pre_forward /
_post_forward around the module's own forward; the DDP module itself is never called.

So the instrument times the replicated module's forwards (the DDP's reducer, comm hook and
all-reduces are the same as a DDP's) and reads the model from it, not from the ParameterList.
"""

from __future__ import annotations

import sys
from typing import Any

FRAMES = 40  # how far up the stack the replicate state's init may be

NOT_FOUND = ("composable replicate(): the module it replicates was not found: steps only, no forward, "
             "backward or communication time")


def replicated_module(torch: Any, ddp: Any) -> tuple[bool, Any]:
    """(whether composable replicate() built `ddp`, the module it replicates or None when it
    cannot be found): its state's `module`, found on the stack, as the DDP is built inside
    that state's init. (False, None) for a DDP of the script's own."""
    if not isinstance(getattr(ddp, "module", None), torch.nn.ParameterList):
        return False, None
    frame: Any = sys._getframe(1)
    for _ in range(FRAMES):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if type(owner).__name__ == "_ReplicateState":
            module = getattr(owner, "module", None)
            return True, module if isinstance(module, torch.nn.Module) and module is not ddp.module else None
        frame = frame.f_back
    return False, None


def model_name(module: Any) -> str:
    """The script's class name: replicate() swaps the module's class for `DDP<Name>`, a
    subclass of its `DDP` and the original class."""
    cls = type(module)
    bases = [b for b in cls.__bases__ if b.__name__ != "DDP"]
    return bases[0].__name__ if cls.__name__.startswith("DDP") and bases else cls.__name__
