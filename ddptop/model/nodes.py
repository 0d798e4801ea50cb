"""A multi-node run's nodes, each read once per refresh from its ranks (issue 30): what the
rank table collapses a node into (its ranks by condition, the steps they are at, the node's
step and own work from ddptop.model.figures, the straggler when it runs there).

Pure: no I/O, no UI.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ddptop.model import figures
from ddptop.model.figures import RankFigures
from ddptop.model.state import RunState
from ddptop.model.status import RANK_LIVE, RankStatus

STALLED = "stalled?"  # a running rank silent past the run's stall bound (Snapshot.status)
# What a node's ranks are counted as, in the order a view lists them.
CONDITIONS = ("live", "stalled", "lost", "failed", "done")
_FAILED = (RankStatus.FAILED, RankStatus.CRASHED)


def condition(status: str) -> str:
    """What a rank's status (as Snapshot.status holds it) counts as in its node's row: live,
    stalled, lost, failed, or done (its script ended: done, stopped, exited)."""
    if status == STALLED:
        return "stalled"
    if status in RANK_LIVE:
        return "live"
    if status == RankStatus.LOST:
        return "lost"
    return "failed" if status in _FAILED else "done"


@dataclass(frozen=True)
class NodeFigures:
    """One node, over its ranks."""

    node: int | None  # the ddptop node (Hello.node); None: ranks whose hello has not arrived
    hosts: tuple[str, ...]
    ranks: tuple[int, ...]
    counts: dict[str, int]  # condition -> how many of its ranks (only conditions it has)
    first_step: int  # its ranks' last steps, least and most (-1: none yet)
    last_step: int
    p50: float | None  # figures.node_step_ms_p50_last50
    own_ms: float | None  # figures.node_own_ms_last50
    straggler: int | None = None  # the straggler named, when it runs on this node

    @property
    def down(self) -> bool:
        """Every rank of the node stalled or lost: the node, not a rank, is in trouble."""
        return bool(self.ranks) and self.counts.get("stalled", 0) + self.counts.get("lost", 0) == len(self.ranks)


def node_figures(state: RunState, ranks: Mapping[int, RankFigures], status: Mapping[int, str],
                 straggler: int | None) -> tuple[NodeFigures, ...]:
    """The run's nodes in order (ranks not connected yet last, as node None); () on a run of
    one node. `ranks` and `status`: the Snapshot's, so a node row reads what its rank rows do."""
    if state.nnodes <= 1:
        return ()
    by_node: dict[int | None, list[int]] = {}
    hosts: dict[int | None, list[str]] = {}
    for r in sorted(state.ranks):
        hello = state.ranks[r].hello
        node = hello.node if hello is not None else None
        by_node.setdefault(node, []).append(r)
        if hello is not None and hello.host not in hosts.setdefault(node, []):
            hosts[node].append(hello.host)
    out = []
    for node in sorted(by_node, key=lambda n: (n is None, n or 0)):
        members = by_node[node]
        counts: dict[str, int] = {}
        for r in members:
            word = condition(status.get(r, state.ranks[r].status))
            counts[word] = counts.get(word, 0) + 1
        steps = [state.ranks[r].steps_run() - 1 for r in members]  # the last step each ran (0-based)
        figs = [ranks[r] for r in members if r in ranks]
        out.append(NodeFigures(
            node=node, hosts=tuple(hosts.get(node, ())), ranks=tuple(members),
            counts={c: counts[c] for c in CONDITIONS if c in counts},
            first_step=min(steps), last_step=max(steps),
            p50=figures.node_step_ms_p50_last50(figs), own_ms=figures.node_own_ms_last50(figs),
            straggler=straggler if straggler in members else None))
    return tuple(out)
