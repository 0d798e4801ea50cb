"""What the views take from the run model: the Snapshot built once per refresh
(ddptop.model.snapshot, from RunState and ddptop.model.figures), and a rank's place for display.
Nothing here computes a figure: that is the model's job, so no two views disagree."""

from __future__ import annotations

from ddptop.model.figures import RankFigures
from ddptop.model.snapshot import Snapshot, snapshot
from ddptop.model.state import RankState, RunState

__all__ = ["LiveFigures", "RankFigures", "Snapshot", "rank_location"]


class LiveFigures:
    """The app's source of Snapshots (RunState caches each rank's window itself)."""

    def snapshot(self, state: RunState, now: float) -> Snapshot:
        return snapshot(state, now)


def rank_location(rs: RankState) -> str:
    h = rs.hello
    return f"{h.host}/{h.device}" if h else "-"
