"""What `ddptop tune` reports, as pure functions over its trials: the ranking, one row per
trial (the sweep's row plus where the trial came from), the Markdown table, the verdict
(the best configuration and the fastest lossless one) and the `ddptop` command line that
runs a configuration. Pure.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from ddptop.analysis.advisor import LOSSY_CAVEAT, NOISE
from ddptop.commands.sweep_table import build_rows, ratio_text, share_text
from ddptop.commands.tune_search import (
    TUNE_KNOBS,
    Trial,
    is_lossy,
    nearest_preset,
    normalize,
    preset_name,
    show_value,
)
from ddptop.model.config import PRESETS, RunConfig
from ddptop.model.report import fmt, markdown_grid

HEADERS = (
    "#",
    "config",
    "settings",
    "tried because",
    "status",
    "steps/s",
    "step p50 ms",
    "comm share",
    "speedup vs baseline",
)


# ---------------------------------------------------------------------------- ranking


def rank_trials(trials: Sequence[Trial]) -> list[Trial]:
    """Completed trials, fastest first (ties: the earlier trial)."""
    done = [t for t in trials if t.rate is not None]
    return sorted(done, key=lambda t: (-(t.rate or 0.0), t.index))


def best_trial(trials: Sequence[Trial], lossless: bool = False) -> Trial | None:
    ranked = [t for t in rank_trials(trials) if not (lossless and is_lossy(t.point))]
    return ranked[0] if ranked else None


def baseline_rate(trials: Sequence[Trial]) -> float | None:
    return next((t.rate for t in trials if t.source == "baseline"), None)


# ---------------------------------------------------------------------------- the table


def tune_rows(trials: Sequence[Trial]) -> list[dict[str, Any]]:
    """One row per trial (in the order tried): sweep's row (settings, steps/s, comm share,
    speedup vs baseline) plus the trial's number, origin and config label."""
    summaries = []
    for t in trials:
        s = dict(t.summary)
        s["preset"] = "baseline" if t.source == "baseline" else f"#{t.index}"
        summaries.append(s)
    rows = build_rows(summaries)
    best = best_trial(trials)
    for t, row in zip(trials, rows):
        row.update(
            trial=t.index,
            source=t.source,
            config=preset_name(t.point),
            point=dict(t.point),
            lossy=is_lossy(t.point),
            best=best is not None and t is best,
            run_dir=t.run_dir,
            wall_s=round(t.wall_s, 1),
            preset=preset_name(t.point),
        )
        if t.label:
            row.update(config=t.label, preset=t.label)
        if row["status"] is None:
            row["status"] = "not run"
    return rows


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Tried configs as a GitHub Markdown table, padded to read as plain text; the best
    row is marked with `*`."""
    cells = [
        [
            f"{r['trial']}{' *' if r.get('best') else ''}",
            str(r["config"]),
            str(r["settings"]),
            str(r["source"]),
            str(r["status"]),
            fmt(r["steps_per_s"], ".2f"),
            fmt(r["step_ms_p50"], ".1f"),
            share_text(r["comm_share"]),
            ratio_text(r["speedup"]),
        ]
        for r in rows
    ]
    return markdown_grid(HEADERS, cells, [h in ("#",) or i >= 5 for i, h in enumerate(HEADERS)])


def render_markdown(
    title: str,
    rows: Sequence[Mapping[str, Any]],
    result: Mapping[str, Any],
    notes: Sequence[str] = (),
) -> str:
    parts = [f"## {title}", "", markdown_table(rows), ""]
    parts += [f"- {n}" for n in notes]
    if notes:
        parts.append("")
    parts.append(f"**Best configuration:** {result['text']}")
    return "\n".join(parts).rstrip() + "\n"


# ---------------------------------------------------------------------------- the verdict


def verdict(
    trials: Sequence[Trial],
    nproc: int,
    extra_sets: Sequence[str] = (),
    user_cmd: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The best configuration, its speedup and command line, and the fastest lossless one
    when the best compresses gradients."""
    best = best_trial(trials)
    base = baseline_rate(trials)
    if best is None:
        return {
            "best": None,
            "text": "no configuration completed with measurements: nothing to recommend.",
        }

    def entry(t: Trial) -> dict[str, Any]:
        return _entry(t, base, nproc, extra_sets, user_cmd)

    out: dict[str, Any] = {"best": entry(best), "best_lossless": None}
    b = out["best"]
    gain = f", {b['speedup']:.2f}x baseline" if b["speedup"] else ""
    text = (
        f"#{best.index} ({b['settings']}): {best.rate:.2f} steps/s{gain}.\n\n    {b['command']}\n"
    )
    if b["speedup"] is not None and b["speedup"] < 1 + NOISE:
        text += (
            f"\nThat is within run-to-run noise ({NOISE:.0%}) of baseline: on this machine the DDP "
            "settings barely matter.\n"
        )
    if b["lossy"]:
        text += f"\nIt compresses gradients ({best.point['comm_hook']} hook): {LOSSY_CAVEAT}."
        safe = best_trial(trials, lossless=True)
        if safe is not None:
            out["best_lossless"] = s = entry(safe)
            sgain = f", {s['speedup']:.2f}x baseline" if s["speedup"] else ""
            text += (
                f" Fastest lossless: #{safe.index} ({s['settings']}): {safe.rate:.2f} steps/s{sgain}:"
                f"\n\n    {s['command']}\n"
            )
    out["text"] = text
    return out


def _entry(t: Trial, base: float | None, nproc: int, extra_sets: Sequence[str],
           user_cmd: Sequence[str] | None) -> dict[str, Any]:
    """One trial in the verdict: its point, rate, speedup and command line."""
    return {
        "trial": t.index,
        "point": dict(t.point),
        "steps_per_s": t.rate,
        "speedup": (t.rate / base) if base and t.rate else None,
        "lossy": is_lossy(t.point),
        "command": command_line(t.point, nproc, extra_sets, user_cmd)
        if not (user_cmd and t.label == "asis")
        else command_line_asis(nproc, extra_sets, user_cmd),
        "settings": RunConfig().with_changes(**t.point).describe(),
    }


# ---------------------------------------------------------------------------- command lines


def _set_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return show_value(value)


def command_line(
    point: Mapping[str, Any],
    nproc: int,
    extra_sets: Sequence[str] = (),
    user_cmd: Sequence[str] | None = None,
) -> str:
    """`ddptop --nproc N --preset X --set k=v ...` that runs `point`; `extra_sets` are the
    user's own --set pairs (kept unless they name a knob the tuner set). With `user_cmd`, every
    tuned knob the preset does not set is --set too (a script keeps its own value of a knob
    nothing sets), and the command follows `--`."""
    name, diff = nearest_preset(point)
    if user_cmd:
        owned = PRESETS[name].settings
        p = normalize(point)
        diff = {k: p[k] for k in TUNE_KNOBS if k in diff or k not in owned}
        if p["comm_hook"] != "powersgd":
            diff.pop("powersgd_rank", None)
    parts = ["ddptop", "--nproc", str(nproc), "--preset", name]
    for k in TUNE_KNOBS:
        if k in diff:
            parts += ["--set", f"{k}={_set_value(diff[k])}"]
    for pair in extra_sets:
        if pair.split("=", 1)[0].strip() not in diff:
            parts += ["--set", pair]
    if user_cmd:
        parts += ["--", *(shlex.quote(a) for a in user_cmd)]
    return " ".join(parts)


def command_line_asis(nproc: int, extra_sets: Sequence[str], user_cmd: Sequence[str]) -> str:
    sets = [x for pair in extra_sets for x in ("--set", pair)]
    return " ".join(["ddptop", "--nproc", str(nproc), *sets, "--", *(shlex.quote(a) for a in user_cmd)])
