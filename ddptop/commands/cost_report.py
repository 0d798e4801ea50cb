"""What `ddptop cost` prints and writes: the runs' figures, the paired result, the A/A, the
ranks' stderr against plain torchrun's, as text and as cost.json. Builds on
analysis/cost_pairs; reads nothing from disk."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from ddptop.analysis import cost_pairs
from ddptop.commands.cost_hooks import HooksReading
from ddptop.commands.cost_plan import Plan, RunRecord
from ddptop.model import bill


def _fmt(x: cost_pairs.Interval | None, digits: int = 4) -> str:
    if x is None:
        return "n/a"
    return f"{x.mean:.{digits}f} [{x.lo:.{digits}f}, {x.hi:.{digits}f}]"


def _arm_lines(records: list[RunRecord], arm: str) -> tuple[str, dict[str, Any]]:
    mine = [r for r in records if r.arm == arm]
    ms = [r.step_ms for r in mine if r.step_ms is not None]
    failed = [f"pair {r.pair + 1} rc={r.rc}" for r in mine if r.rc != 0]
    unstamped = [f"pair {r.pair + 1}" for r in mine if r.rc == 0 and r.step_ms is None]
    wall = statistics.fmean(r.wall_s for r in mine) if mine else float("nan")
    name = "plain torchrun" if arm == cost_pairs.PLAIN else "under ddptop"
    text = f"  {name:<15} {statistics.fmean(ms):8.3f} ms a step" if ms else f"  {name:<15}      n/a"
    text += f"   ({len(ms)} of {len(mine)} runs measured; whole run {wall:.1f} s from start to exit)"
    if failed:
        text += f"; failed: {', '.join(failed)}"
    if unstamped:
        text += f"; no optimizer steps stamped: {', '.join(unstamped)} (a script without torch.optim: unknown)"
    data = {"runs": len(mine), "measured": len(ms), "step_ms": ms, "wall_s": [r.wall_s for r in mine],
            "failed": failed, "unstamped": unstamped}
    return text, data


def _own_view(records: list[RunRecord]) -> str | None:
    """ddptop's own step p50 in its arm, beside the stamps' mean: a cross-check."""
    p50 = [float(r.summary["step_ms_p50"]) for r in records
           if r.summary and isinstance(r.summary.get("step_ms_p50"), (int, float))]
    if not p50:
        return None
    return f"  ddptop's own view of its runs: step p50 {statistics.median(p50):.3f} ms (median over {len(p50)} runs)"


def render(records: list[RunRecord], plan: Plan, where: Path,
           aa_ms: list[tuple[float, float]] | None = None, hooks: HooksReading | None = None) -> dict[str, Any]:
    ms = {(r.pair, r.arm): r.step_ms for r in records}
    result = cost_pairs.analyse(ms, plan.pairs, aa_ms if plan.lockstep else None)
    said = None if result is None else cost_pairs.verdict(result)
    plain_text, plain = _arm_lines(records, cost_pairs.PLAIN)
    ours_text, ours = _arm_lines(records, cost_pairs.DDPTOP)
    pins = " | ".join(_span(c) for c in plan.cpus) if plan.cpus else "not pinned"
    lines = [f"ddptop cost of `{' '.join(plan.cmd)}` on {plan.nproc} rank(s), ranks on CPUs {pins}:",
             plain_text, ours_text]
    own = None if plan.lockstep else _own_view(records)  # in turns, its steps hold the other job's turn
    if own:
        lines.append(own)
    if result is None:
        lines.append("  no pair has both runs measured: no result")
    else:
        extra = result.extra_ms
        if extra is not None:
            lines.append(f"  ddptop costs {extra.mean * 1000:+.0f} us a step per rank [{extra.lo * 1000:+.0f}, "
                         f"{extra.hi * 1000:+.0f}] (95%, t over {extra.n} pairs)")
        lines.append(f"  ratio plain / ddptop {_fmt(result.ratio)} (below 1: slower under ddptop)")
        lines.append(f"  A/A, plain / plain {'beside each other in turns' if plan.lockstep else 'of adjacent runs'}: "
                     f"{_fmt(result.aa)}")
        lines.append(f"  verdict: {said}")
    if hooks is not None:
        lines.append(_hooks_line(hooks))
    predicted = _prediction(records, hooks.arm_figure if hooks is not None else None)
    if predicted is not None:
        lines.append(f"  {predicted.text()}")
        if result is not None and result.extra_ms is not None and predicted.hooks_measured:
            inside = result.extra_ms.lo * 1000 <= predicted.us <= result.extra_ms.hi * 1000
            lines.append(f"  the bill's prediction is {'inside' if inside else 'OUTSIDE'} the measured interval")
    plain_err = [line for r in records if r.arm == cost_pairs.PLAIN for line in r.stderr]
    our_err = [line for r in records if r.arm == cost_pairs.DDPTOP for line in r.stderr]
    added = cost_pairs.added_lines(plain_err, our_err)
    if not any(r.arm == cost_pairs.PLAIN and r.rc == 0 for r in records):
        lines.append("  stderr: no plain run completed to compare with")
    elif added:
        lines.append(f"  stderr: {len(added)} line(s) in the ranks' stderr under ddptop that no plain run printed:")
        lines += [f"    {line[:160]}" for line in added[:5]]
    else:
        lines.append("  stderr: the ranks' stderr under ddptop holds no line that the plain runs' lacks (numbers masked)")
    lines.append("  (the demo/script's own numbers; the in-run `--cost` measures only the rank-side hooks' share)")
    data = {"cmd": plan.cmd, "nproc": plan.nproc, "pairs": plan.pairs, "lockstep": plan.lockstep,
            "cpus": plan.cpus, "dir": str(where),
            "plain": plain, "ddptop": ours, "result": None if result is None else result.as_dict(),
            "verdict": said, "stderr_added": added,
            "aa_rounds": [list(pair) for pair in aa_ms or []] if plan.lockstep else None,
            "bill": None if predicted is None else {"us": predicted.us, "lo": predicted.lo, "hi": predicted.hi,
                                                    "allreduces": predicted.allreduces,
                                                    "nccl_timing": predicted.nccl_timing,
                                                    "hooks_measured": predicted.hooks_measured},
            "hooks": None if hooks is None else hooks.as_dict()}
    return {"text": "\n".join(lines), "json": data}


def _prediction(records: list[RunRecord], hooks: bill.Figure | None) -> bill.Prediction | None:
    ours = [r for r in records if r.arm == cost_pairs.DDPTOP and r.rc == 0]
    if not ours:
        return None
    counts = [r.allreduces for r in ours if r.allreduces is not None]
    return bill.predict(statistics.median(counts) if counts else None, ours[0].every, ours[0].nccl_timing, hooks)


def _hooks_line(hooks: HooksReading) -> str:
    if hooks.figure is None:
        return f"  the rank-side hooks on this script: not measured ({hooks.why})"
    fig = hooks.figure
    arm = hooks.arm_figure
    timed = "" if arm is None or hooks.timed >= 1.0 else (
        f"; the ddptop arm timed {100 * hooks.timed:.0f}% of its steps (phase_every), so {arm.us:+.0f} us "
        f"[{arm.lo:+.0f}, {arm.hi:+.0f}] there")
    return (f"  the rank-side hooks on this script (one more run, `--cost {hooks.steps}`: engaged vs bypassed step by "
            f"step): {fig.us:+.0f} us a timed step per rank [{fig.lo:+.0f}, {fig.hi:+.0f}]{timed}; that run's own "
            f"check: {hooks.verdict or 'n/a'}")


def _span(cpus: list[int]) -> str:
    if cpus and cpus == list(range(cpus[0], cpus[-1] + 1)):
        return f"{cpus[0]}-{cpus[-1]}" if len(cpus) > 1 else str(cpus[0])
    return ",".join(map(str, cpus))
