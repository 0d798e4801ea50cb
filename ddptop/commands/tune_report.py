"""What `ddptop tune` reports, as pure functions over its trials: the ranking, one row per
trial (the sweep's row plus where the trial came from), the Markdown table, the verdict
(the best configuration and the fastest lossless one) and the `ddptop` command line that
runs a configuration. Pure.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from ddptop.analysis.advisor import LOSSY_CAVEAT
from ddptop.analysis.sweep_advice import Choice, Measured, choose, noise_text, not_faster
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
from ddptop.model.figures import speedup
from ddptop.model.report import fmt, fmt_step_rate, markdown_grid

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


def tune_rows(trials: Sequence[Trial], recommended: int | None = None) -> list[dict[str, Any]]:
    """One row per trial (in the order tried): sweep's row (settings, steps/s, comm share,
    speedup vs baseline) plus the trial's number, origin and config label; `best` marks the
    `recommended` trial (the verdict's; by default the fastest)."""
    summaries = []
    for t in trials:
        s = dict(t.summary)
        s["preset"] = "baseline" if t.source == "baseline" else f"#{t.index}"
        summaries.append(s)
    rows = build_rows(summaries)
    fastest = best_trial(trials)
    mark = recommended if recommended is not None else (fastest.index if fastest else None)
    for t, row in zip(trials, rows):
        row.update(
            trial=t.index,
            source=t.source,
            config=preset_name(t.point),
            point=dict(t.point),
            lossy=is_lossy(t.point),
            best=t.index == mark,
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
    """Tried configs as a GitHub Markdown table, padded to read as plain text; the
    recommended row is marked with `*`."""
    cells = [
        [
            f"{r['trial']}{' *' if r.get('best') else ''}",
            str(r["config"]),
            str(r["settings"]),
            str(r["source"]),
            str(r["status"]),
            fmt_step_rate(r["steps_per_s"]),
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
    parts.append(f"**Recommendation (measured):** {result['text']}")
    return "\n".join(parts).rstrip() + "\n"


# ---------------------------------------------------------------------------- the verdict


def verdict(
    trials: Sequence[Trial],
    nproc: int,
    extra_sets: Sequence[str] = (),
    user_cmd: Sequence[str] | None = None,
) -> dict[str, Any]:
    """What to use, from the trials alone: the fastest lossless configuration that beats the
    baseline beyond noise, the fastest lossy one with its caveat, or keep the baseline when
    nothing does (ddptop.analysis.sweep_advice.choose, as the sweep decides). `best` is the
    fastest trial whatever the noise; `recommended` the one to use."""
    best = best_trial(trials)
    if best is None:
        return {"best": None, "recommended": None,
                "text": "no configuration completed with measurements: nothing to recommend."}
    base = baseline_rate(trials)

    def entry(t: Trial | None) -> dict[str, Any] | None:
        return None if t is None else _entry(t, base, nproc, extra_sets, user_cmd)

    ranked = rank_trials(trials)
    done = [_measured(t) for t in ranked]
    ref = next((m for m, t in zip(done, ranked) if t.source == "baseline"), None)
    c = choose(done, ref) if ref is not None else Choice(done[0], done[0], None, None)
    by_index = {t.index: t for t in trials}

    def trial(m: Measured | None) -> Trial | None:
        return None if m is None else by_index[m.trial]

    out: dict[str, Any] = {"best": entry(best), "keep": c.pick is None,
                           "best_lossless": entry(trial(c.lossless)),
                           "recommended": entry(trial(c.pick or c.ref))}
    r = out["recommended"]
    if c.pick is None:
        fastest = "it was the fastest" if best.index == c.ref.trial else (
            f"the fastest, #{best.index} ({out['best']['settings']}), ran {(best.rate or 0) / c.ref.rate:.2f}x it")
        text = (f"keep the baseline, #{c.ref.trial} ({r['settings']}): nothing beat it beyond noise; "
                f"{fastest}.\n\n    {r['command']}\n")
    else:
        text = f"#{c.pick.trial} ({r['settings']}): {c.pick.rate:.2f} steps/s{_gain(r)}.\n\n    {r['command']}\n"
        if c.tied:  # as the sweep says it: the table cannot rank these
            names = ", ".join(f"#{m.trial} ({m.rate:.2f} steps/s)" for m in c.tied)
            text += (f"\nTied with {names}: neither beats the other beyond noise, so the trials cannot rank "
                     f"them; #{c.pick.trial} is named for its higher median.\n")
            out["tied"] = [m.trial for m in c.tied]
        if c.pick.lossy:
            text += f"\nIt compresses gradients ({c.pick.changes['comm_hook']} hook): {LOSSY_CAVEAT}."
            text += _lossless_text(out["best_lossless"])
        elif c.lossy is not None:
            lossy = by_index[c.lossy.trial]
            text += (f"\n#{lossy.index} ({RunConfig().with_changes(**lossy.point).describe()}) compresses "
                     f"gradients and {not_faster(c.lossy, c.pick)}.\n")
    out["text"] = text + f"\n{noise_text(done).capitalize()}.\n"
    return out


def _gain(e: Mapping[str, Any]) -> str:
    return f", {e['speedup']:.2f}x baseline" if e.get("speedup") else ""


def _lossless_text(s: Mapping[str, Any] | None) -> str:
    if s is None:
        return " No lossless configuration beat the baseline beyond noise: keep it if accuracy must not change.\n"
    return f" Fastest lossless: #{s['trial']} ({s['settings']}): {s['steps_per_s']:.2f} steps/s{_gain(s)}:\n\n    {s['command']}\n"


def _measured(t: Trial) -> Measured:
    ci = t.summary.get("steps_per_s_ci")
    return Measured(f"#{t.index}", t.label or preset_name(t.point), t.rate or 0.0,
                    (float(ci[0]), float(ci[1])) if ci else None, is_lossy(t.point), dict(t.point),
                    trial=t.index)


def _entry(t: Trial, base: float | None, nproc: int, extra_sets: Sequence[str],
           user_cmd: Sequence[str] | None) -> dict[str, Any]:
    """One trial in the verdict: its point, rate, speedup and command line."""
    return {
        "trial": t.index,
        "point": dict(t.point),
        "steps_per_s": t.rate,
        "speedup": speedup(t.rate, base),
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
