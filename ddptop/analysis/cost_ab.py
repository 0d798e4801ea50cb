"""What ddptop's rank-side layer costs a script, from the blocks the ranks timed with the
layer engaged and bypassed (`--set cost_ab=S`, ddptop.rank.cost_ab).

Each group of blocks ran every arm once, back to back, so a group's blocks share the
machine's state; each arm is compared with `off` inside its group only (paired), and the
groups' ratios are summarised by their median with a bootstrap 95% interval. Ranks run in
lockstep, so a group's time per step is the mean over ranks. Pure: dicts in, numbers out.
"""

from __future__ import annotations

import random
import statistics
from typing import Any

from ddptop.model.cost import ArmCost, Estimate, RunCost

BOOTSTRAP = 4000
SEED = 7


def median_ci(values: list[float], seed: int = SEED) -> Estimate:
    """The median and a percentile-bootstrap 95% interval of it."""
    if not values:
        return Estimate(float("nan"), float("nan"), float("nan"), 0)
    rng = random.Random(seed)
    n = len(values)
    meds = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(BOOTSTRAP))
    return Estimate(statistics.median(values), meds[int(0.025 * BOOTSTRAP)], meds[int(0.975 * BOOTSTRAP) - 1], n)


Row = dict[str, float]  # one arm of one group: ms, cpu, typical, hook (per step), gc, gc_ms, steps


def block_row(block: dict[str, Any]) -> Row:
    steps = float(block["steps"])
    per_step = block.get("step_ms") or []
    return {"ms": float(block["ms"]) / steps, "cpu": float(block.get("cpu_ms", 0.0)) / steps,
            "typical": statistics.median(per_step) if per_step else float("nan"),
            "hook": float(block.get("hook_ms", float("nan"))) / steps,
            "gc": float(block.get("gc", 0)), "gc_ms": float(block.get("gc_ms", 0.0)), "steps": steps}


def group_means(results: list[dict[str, Any]]) -> dict[int, dict[str, Row]]:
    """group -> arm -> its figures per step (mean over the ranks that timed it; gc summed)."""
    acc: dict[int, dict[str, list[Row]]] = {}
    for result in results:
        for block in result.get("blocks", []):
            if (block.get("steps") or 0) > 0:
                acc.setdefault(int(block["group"]), {}).setdefault(str(block["arm"]), []).append(block_row(block))
    n_ranks = max((len(rows) for arms in acc.values() for rows in arms.values()), default=0)
    out: dict[int, dict[str, Row]] = {}
    for group, arms in acc.items():
        if any(len(rows) != n_ranks for rows in arms.values()):
            continue  # a group some rank did not finish (the run ended inside it)
        out[group] = {arm: {key: (sum if key.startswith(("gc", "steps")) else statistics.fmean)(r[key] for r in rows)
                            for key in rows[0]} for arm, rows in arms.items()}
    return out


def _paired(pairs: list[tuple[Row, Row]], key: str, ratio: bool = False, scale: float = 1.0) -> Estimate | None:
    rows = [(mine[key], off[key]) for mine, off in pairs if mine[key] == mine[key] and off[key] == off[key]]
    if not rows:
        return None
    return median_ci([off / mine if ratio else (mine - off) * scale for mine, off in rows if not ratio or mine > 0])


def _gc(groups: dict[int, dict[str, Row]], arm: str) -> dict[str, float]:
    rows = [g[arm] for g in groups.values() if arm in g]
    steps = sum(r["steps"] for r in rows) or 1.0
    return {"per_1000_steps": 1000.0 * sum(r["gc"] for r in rows) / steps, "ms_per_step": sum(r["gc_ms"] for r in rows) / steps}


def analyse(results: list[dict[str, Any]]) -> list[ArmCost]:
    """Each arm but off, against off in the same group."""
    groups = group_means(results)
    arms = sorted({arm for g in groups.values() for arm in g if arm != "off"}, key=["on", "aa", "busy"].index)
    # blocks of one step: a block's median step is the block (the typical-step figure would repeat the ratio)
    several = any((b.get("steps") or 0) > 1 for r in results for b in r.get("blocks", []))
    off_ms = [g["off"]["ms"] for g in groups.values() if "off" in g]
    spins = [b["busy_ms"] / b["steps"] for r in results for b in r.get("blocks", []) if b.get("busy_ms") and b["steps"]]
    out = []
    for arm in arms:
        pairs = [(g[arm], g["off"]) for g in groups.values() if arm in g and "off" in g]
        empty = Estimate(float("nan"), float("nan"), float("nan"), 0)
        out.append(ArmCost(
            arm=arm,
            ratio=_paired(pairs, "ms", ratio=True) or empty,
            ms_per_step=_paired(pairs, "ms") or empty,
            cpu_us_per_step=_paired(pairs, "cpu", scale=1000.0) or empty,
            step_ms=statistics.median(off_ms) if off_ms else float("nan"),
            injected_ms=statistics.median(spins) if arm == "busy" and spins else None,
            typical=_paired(pairs, "typical", ratio=True) if several else None,
            hook_us_per_step=_paired(pairs, "hook", scale=1000.0),
            gc={"arm": _gc(groups, arm)["per_1000_steps"], "off": _gc(groups, "off")["per_1000_steps"],
                "arm_ms_per_step": _gc(groups, arm)["ms_per_step"], "off_ms_per_step": _gc(groups, "off")["ms_per_step"]},
        ))
    return out


def check_passed(cost: ArmCost) -> bool:
    """The method's own checks: the A/A reads 1.000 within ±0.002, the busy wait is seen
    (its interval below 1); any other arm is no check."""
    if cost.arm == "aa":
        return abs(cost.ratio.median - 1.0) <= 0.002
    if cost.arm == "busy":
        return cost.ratio.hi < 1.0
    return True


def verdict(cost: ArmCost, busy_pct: float = 0.5) -> str:
    """One line on what the arm's interval says."""
    r = cost.ratio
    if cost.arm == "aa":
        return f"A/A {'reads 1.000 within ±0.002' if check_passed(cost) else 'is off by more than 0.002'}"
    if cost.arm == "busy":
        seen = check_passed(cost)
        pct = busy_pct if cost.injected_ms is None else 100 * cost.injected_ms / cost.step_ms
        got = cost.ms_per_step
        inside = cost.injected_ms is not None and got.lo <= cost.injected_ms <= got.hi
        return (f"the calibration is {'seen' if seen else 'NOT seen'}: injected {pct:.2f}% "
                f"(expected ratio {1 / (1 + pct / 100):.4f})"
                + ("" if cost.injected_ms is None else f", {'inside' if inside else 'outside'} the interval"))
    line = f"cost {_against_the_bar(r)}"
    t = cost.typical
    if not _within(r) and t is not None and t.n:
        line += f"; on the typical step {_against_the_bar(t)} ({t.median:.4f} [{t.lo:.4f}, {t.hi:.4f}])"
    return line


def _within(r: Estimate) -> bool:
    return r.median >= 0.995 and r.lo >= 0.99


def _against_the_bar(r: Estimate) -> str:
    """Within 0.5%, over it (the whole interval below 0.995), or neither shown."""
    if _within(r):
        return "within 0.5% (median ≥ 0.995 and lower bound ≥ 0.99)"
    if r.hi < 0.995:  # even the interval's best end costs more
        return "NOT within 0.5% (the whole interval is below 0.995)"
    return (f"not shown within 0.5% nor over it (median ≥ 0.995 and lower bound ≥ 0.99 wanted; "
            f"the interval reaches {r.hi:.4f}: more steps narrow it)")


def verdicts(costs: list[ArmCost], busy_pct: float = 0.5) -> dict[str, str]:
    """Each arm's verdict; the engaged arm's stands only where the same run's own checks
    passed (A/A within ±0.002, the busy wait seen): a run whose identical arms differ has
    intervals narrower than its noise, whatever they say about the layer."""
    out = {c.arm: verdict(c, busy_pct) for c in costs}
    failed = [c for c in costs if not check_passed(c)]
    if "on" in out and failed:
        why = ", ".join(f"{c.arm} read {c.ratio.median:.4f}" for c in failed)
        out["on"] += f"; NOT TRUSTED: this run's own check failed ({why})"
    return out


def run_summary(costs: list[ArmCost], busy_pct: float = 0.5) -> RunCost | None:
    """The run's cost from analyse()'s arms (None: no blocks)."""
    if not costs:
        return None
    return RunCost(max(c.ratio.n for c in costs), costs[0].step_ms, list(costs), verdicts(costs, busy_pct))
