"""Rank-side client: connects to the ddptop hub named in the environment, sends a
hello and batched step records, and receives commands (stop, capture).

Every rank ddptop launches is measured without it (ddptop.rank); a script may still add
its own numbers, or end its loop itself when ddptop asks, in three lines:

    from ddptop.probe import Probe
    probe = Probe.connect()                 # does nothing when not run under ddptop
    ...  if probe.tick(samples=len(x), loss=loss): break   # once per step; True = ddptop asks to stop

Under the instrument, tick()/record() add to the step it measured (never a second step).

The public import path of `ddptop.rank.client`, which holds the code; imports only the
standard library and `ddptop.wire`, never torch.
"""

from __future__ import annotations

from ddptop.rank.client import FLUSH_S, MAX_BATCH, AttachedProbe, Probe

__all__ = ["FLUSH_S", "MAX_BATCH", "AttachedProbe", "Probe"]
