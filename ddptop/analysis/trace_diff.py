"""Two captures compared (`ddptop trace A B --diff`): per rank, the window and each kernel
class (compute / comm / memory, idle) before and after, and the kernels that got faster or
slower, by how much. Pure: takes the summaries ddptop.analysis.rank_trace made."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

CLASSES = ("window", "busy", "idle", "compute", "comm", "memory")


def _by_rank(summaries: Sequence[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    ranks = [s.get("rank") for s in summaries]
    if len(set(ranks)) == len(ranks) and all(isinstance(r, int) for r in ranks):
        return {int(s["rank"]): s for s in summaries}
    return dict(enumerate(summaries))


def _change(before: float | None, after: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {"before_ms": before, "after_ms": after}
    if before is not None and after is not None:
        out["delta_ms"] = round(after - before, 3)
        out["ratio"] = round(after / before, 3) if before > 0 else None
    return out


def diff(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]], kernels: int = 10) -> dict[str, Any]:
    """Per rank both captures have: each class's change and the `kernels` kernels whose total
    time changed most (by name; `faster` or `slower`); ranks only one capture has are named."""
    before, after = _by_rank(a), _by_rank(b)
    ranks: dict[str, Any] = {}
    for r in sorted(set(before) & set(after)):
        x, y = before[r], after[r]
        row: dict[str, Any] = {"before": x.get("file"), "after": y.get("file"),
                               "classes": {k: _change(x.get(f"{k}_ms"), y.get(f"{k}_ms")) for k in CLASSES}}
        tops = {k["name"]: k for k in x.get("top") or []}, {k["name"]: k for k in y.get("top") or []}
        changes = []
        for name in set(tops[0]) | set(tops[1]):
            was, now = tops[0].get(name), tops[1].get(name)
            c = _change(was["ms"] if was else 0.0, now["ms"] if now else 0.0)
            c.update({"name": name, "kind": (now or was or {}).get("kind"),
                      "count": [was["count"] if was else 0, now["count"] if now else 0]})
            c["verdict"] = "slower" if c["delta_ms"] > 0 else "faster" if c["delta_ms"] < 0 else "same"
            changes.append(c)
        changes.sort(key=lambda c: (-abs(c["delta_ms"]), c["name"]))
        row["kernels"] = changes[:kernels]
        ranks[str(r)] = row
    out: dict[str, Any] = {"ranks": ranks}
    only = sorted(set(before) ^ set(after))
    if only:
        out["note"] = "only in one capture: " + ", ".join(
            f"rank {r} ({'before' if r in before else 'after'})" for r in only)
    return out


def describe_diff(d: dict[str, Any]) -> list[str]:
    """The comparison in plain lines."""
    lines = []
    for r, row in d["ranks"].items():
        lines.append(f"rank {r}: {row['before']} -> {row['after']}")
        for k, c in row["classes"].items():
            if c.get("delta_ms") is None:
                continue
            ratio = f" (x{c['ratio']:.3f})" if c.get("ratio") is not None else ""
            lines.append(f"  {k:<8} {c['before_ms']:10.3f} -> {c['after_ms']:10.3f} ms  "
                         f"{c['delta_ms']:+10.3f}{ratio}")
        for c in row["kernels"]:
            lines.append(f"  {c['verdict']:<6} {c['delta_ms']:+10.3f} ms  {c['before_ms']:.3f} -> {c['after_ms']:.3f} "
                         f"(x{c['count'][0]} -> x{c['count'][1]}, {c['kind']})  {c['name'][:80]}")
    if d.get("note"):
        lines.append(d["note"])
    return lines
