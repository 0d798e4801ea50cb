"""The sweep's table, built by pure functions over run summaries (summary.json dicts):
one row per run with speedups and scaling efficiency (`build_rows`), or, with repeated runs,
one row per preset over its runs (`fold_runs`: median, interval across runs), its Markdown
(`markdown_table`, `render_markdown`); and the Markdown table renderer and cell formats that
`ddptop tune`'s table uses too (`markdown_grid`, `ratio_text`, `share_text`). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ddptop.analysis.across_runs import across_interval, ratio_interval
from ddptop.analysis.advisor import Advice
from ddptop.analysis.sweep_advice import measured, reference
from ddptop.model.config import ConfigError, RunConfig
from ddptop.model.figures import median, speedup, summary_comm_shares, summary_mean_ms
from ddptop.model.report import NA, fmt, fmt_step_rate, markdown_grid

IN_EFFECT = ("static_graph", "gradient_as_bucket_view", "bucket_cap_mb", "comm_hook", "autocast")


# ---------------------------------------------------------------------------- cells


def ratio_text(value: float | None) -> str:
    return fmt(value, ".2f") + ("x" if value is not None else "")


def share_text(value: float | None) -> str:
    return NA if value is None else f"{value * 100:.0f}%"


# ---------------------------------------------------------------------------- rows


def _settings(summary: Mapping[str, Any]) -> str:
    if summary.get("command"):
        return in_effect(summary)
    try:
        return RunConfig.from_dict(dict(summary.get("config") or {})).describe()
    except (ConfigError, TypeError):
        return "-"


def rank_info(summary: Mapping[str, Any]) -> dict[str, Any]:
    """What the first rank's instrument read off the script's DDP (empty when nothing)."""
    for r in summary.get("ranks") or []:
        if isinstance(r, Mapping) and isinstance(r.get("info"), Mapping) and "static_graph" in r["info"]:
            return dict(r["info"])
    return {}


def in_effect(summary: Mapping[str, Any]) -> str:
    """A script run's DDP arguments in effect, as read back from the rank's DDP object after
    construction (not what was asked), e.g. `bucket 100MB, static, view, hook bf16_compress_hook`."""
    info = rank_info(summary)
    if not info:
        return "-"
    parts = []
    if isinstance(info.get("bucket_cap_mb"), (int, float)):
        parts.append(f"bucket {info['bucket_cap_mb']:g}MB")
    parts += [word for key, word in (("static_graph", "static"), ("gradient_as_bucket_view", "view"))
              if info.get(key)]
    hook = str(info.get("comm_hook") or "")
    if hook and not hook.startswith("allreduce"):
        parts.append("hook " + hook.removesuffix("_hook"))
    if info.get("autocast") not in (None, "none"):
        parts.append(f"autocast {info['autocast']}")
    return ", ".join(parts)


def _row(s: Mapping[str, Any]) -> dict[str, Any]:
    share, exposed = summary_comm_shares(s)
    row = {
        "preset": s.get("preset"),
        "settings": _settings(s),
        "world_size": s.get("world_size"),
        "status": s.get("status"),
        "error": s.get("error") or "",
        "steps_per_s": s.get("steps_per_s"),
        "steps_per_s_ci": s.get("steps_per_s_ci"),  # 95%, from per-step times (the sweep reads them)
        "samples_per_s": s.get("samples_per_s"),
        "tokens_per_s": s.get("tokens_per_s"),
        "step_ms_p50": s.get("step_ms_p50"),
        "comm_ms": summary_mean_ms(s, "comm_ms"),
        "comm_share": share,
        "exposed_comm_ms": summary_mean_ms(s, "exposed_comm_ms"),
        "exposed_comm_share": exposed,
        "run_id": s.get("run_id"),
    }  # fmt: skip
    if s.get("command"):  # what the script asked for and what ddptop changed, read back
        info = rank_info(s)
        row.update(ddp_asked=info.get("ddp_asked"), ddp_set=info.get("ddp_set"),
                   in_effect={k: info.get(k) for k in IN_EFFECT})
    return row


def build_rows(summaries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per run summary (summary.json dicts), with speedup vs `baseline` (else vs the
    first row with a throughput) and scaling efficiency vs `single` when it is in the sweep:
    steps/s of the row over steps/s of single, as each rank processes its own batch."""
    return _relative([_row(s) for s in summaries])


def _relative(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` with their speedup vs the reference and efficiency vs single; with an interval
    across runs, the speedup's interval too (ddptop.analysis.across_runs.ratio_interval)."""
    ref = reference_preset(rows)
    ref_rate = next((r["steps_per_s"] for r in rows if r["preset"] == ref), None)
    single = next(
        (r["steps_per_s"] for r in rows if r["preset"] == "single" and r["steps_per_s"]), None
    )
    ref_ci = next((r.get("steps_per_s_ci") for r in rows if r["preset"] == ref), None)
    for r in rows:
        r["speedup"] = speedup(r["steps_per_s"], ref_rate)
        r["efficiency"] = speedup(r["steps_per_s"], single)
        if "runs" in r:
            r["speedup_ci"] = ratio_interval(r.get("steps_per_s_ci"), ref_ci) if r["speedup"] else None
    return rows


# A preset's row over its runs: these are each the median of its completed runs'.
MEDIANS = ("steps_per_s", "samples_per_s", "tokens_per_s", "step_ms_p50", "comm_ms", "comm_share",
           "exposed_comm_ms", "exposed_comm_share")


def fold_runs(groups: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """One row per preset from its runs' summaries (`groups`, one list per preset, each in the
    order its runs ran): the median of each figure over the completed runs, the 95% interval
    of steps/s across them (ddptop.analysis.across_runs.across_interval, from the runs'
    `steps_per_s` and per-step `steps_per_s_ci`), `runs` completed of `runs_total`, and each
    run's steps/s. Completed when any run completed; the others' errors are kept."""
    rows = []
    for group in groups:
        each = [_row(s) for s in group]
        done = [r for r in each if r["status"] == "completed" and r["steps_per_s"]]
        row = dict(done[0] if done else each[0])
        for key in MEDIANS:
            values = [r[key] for r in done if r.get(key) is not None]
            row[key] = median(sorted(values))
        ci = across_interval([r["steps_per_s"] for r in done], [r["steps_per_s_ci"] for r in done])
        row.update(steps_per_s_ci=ci if len(done) > 1 else (done[0]["steps_per_s_ci"] if done else None),
                   runs=len(done), runs_total=len(each), run_rates=[r["steps_per_s"] for r in each],
                   run_ids=[r["run_id"] for r in each],
                   error="; ".join(f"run {i}: {r['status']}: {r['error']}" for i, r in enumerate(each, 1)
                                   if r not in done and r["error"]) or row["error"])
        rows.append(row)
    return _relative(rows)


def reference_preset(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """What speedups are measured against: the script as it is (asis) or baseline if it ran,
    else the first DDP run that did (the recommendation's reference, so the two agree)."""
    ref = reference(measured(rows))
    return ref.preset if ref is not None else None


def ci_text(ci: Sequence[float] | None) -> str:
    return NA if not ci else f"{ci[0]:.2f}-{ci[1]:.2f}"


# ---------------------------------------------------------------------------- the table


def table_cells(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Headers and formatted cells; the efficiency column only when `single` is in the sweep."""
    ref = reference_preset(rows)
    has_single = any(r["preset"] == "single" for r in rows)
    has_tokens = any(r.get("tokens_per_s") for r in rows)
    has_ci = any(r.get("steps_per_s_ci") for r in rows)
    folded = any("runs" in r for r in rows)  # repeated runs: medians, intervals across runs
    headers = [
        "preset",
        "settings",
        "ranks",
        "status",
        *(["runs"] if folded else []),
        "steps/s median" if folded else "steps/s",
        *(["steps/s 95% CI across runs (t)" if folded else "steps/s 95% CI"] if has_ci else []),
        "samples/s",
        *(["tokens/s"] if has_tokens else []),
        "step p50 ms",
        "comm share",
        "exposed comm ms",
        f"speedup vs {ref or 'baseline'}",
        *(["speedup 95% CI"] if folded else []),
    ]
    if has_single:
        headers.append("efficiency vs single")
    cells = []
    for r in rows:
        row = [
            str(r["preset"]),
            r["settings"],
            fmt(r["world_size"], "d"),
            str(r["status"]),
            *([f"{r['runs']}/{r['runs_total']}"] if folded else []),
            fmt_step_rate(r["steps_per_s"]),
            *([ci_text(r.get("steps_per_s_ci"))] if has_ci else []),
            fmt(r["samples_per_s"], ".1f"),
            *([fmt(r.get("tokens_per_s"), ".0f")] if has_tokens else []),
            fmt(r["step_ms_p50"], ".1f"),
            share_text(r["comm_share"]),
            fmt(r["exposed_comm_ms"], ".1f"),
            ratio_text(r["speedup"]),
            *([ci_text(r.get("speedup_ci"))] if folded else []),
        ]
        if has_single:
            row.append(share_text(r["efficiency"]))
        cells.append(row)
    return headers, cells


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A GitHub Markdown table, padded so it also reads as plain text; numbers right-aligned."""
    headers, cells = table_cells(rows)
    return markdown_grid(headers, cells, [i >= 4 or h == "ranks" for i, h in enumerate(headers)])


def render_markdown(
    rows: Sequence[Mapping[str, Any]],
    advice: Advice,
    title: str,
    diagnosis: Advice | None = None,
    notes: Sequence[str] = (),
    scored: Sequence[str] = (),
) -> str:
    """The whole sweep.md: title, table, notes, the recommendation (measured) and, when there
    is one, the advisor's reading of the reference run set against the table (ddptop.analysis
    .sweep_advice.explain), each tagged with its basis; and `scored`, the advisor's expectations
    before the sweep scored against the table (ddptop.analysis.sweep_expect.score_lines)."""
    parts = [f"## {title}", "", markdown_table(rows), ""]
    failed = [r for r in rows if r["error"] and (r["status"] != "completed" or "runs" in r)]
    parts += [f"- {r['preset']}: {r['status']}: {r['error']}" for r in failed]
    parts += [f"- {n}" for n in notes]
    if failed or notes:
        parts.append("")
    parts.append(f"**Recommendation ({advice.label}):** {advice.reason}")
    if diagnosis is not None and diagnosis.reason:
        parts += ["", f"**Why ({diagnosis.label}; the advisor on the {reference_preset(rows)} run):** "
                  f"{diagnosis.reason}"]
    if scored:
        parts += ["", *scored]
    return "\n".join(parts) + "\n"
