"""Run ids: when a run started, its preset and a short random tag. Used by every process
that starts a run (session, supervisor viewer, a multi-node worker)."""

from __future__ import annotations

import secrets
import time


def new_run_id(preset: str) -> str:
    return time.strftime("%Y%m%d-%H%M%S") + f"-{preset}-{secrets.token_hex(2)}"
