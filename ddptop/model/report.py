"""Plain-text tables and status lines for headless mode and the CLI. Pure."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Sequence
from typing import Any

from ddptop.model import figures
from ddptop.model.capture import perturbation_line
from ddptop.model.config import PRESETS, RunConfig, preset_config
from ddptop.model.rank_state import timed_every
from ddptop.model.run_summary import STEPS_PER_S_DIGITS
from ddptop.model.snapshot import snapshot
from ddptop.model.state import RunState
from ddptop.model.status import RunStatus
from ddptop.model.text import printable

NA = "n/a"  # how every view writes a value it does not have


def fmt(value: float | None, spec: str = ".1f", na: str = NA) -> str:
    return na if value is None else format(value, spec)


def fmt_step_rate(value: float | None, na: str = NA) -> str:
    """Every view's steps/s: the digits summary.json keeps (STEPS_PER_S_DIGITS), so a figure
    reads the same in the TUI, the status line, the exit summary and the JSON."""
    return fmt(value, f".{STEPS_PER_S_DIGITS}f", na)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], width: int | None = None,
          drop: Sequence[str] = ()) -> str:
    """The one plain-text table. Given a `width` (the terminal's), it fits: first the `drop`
    columns go (by header, in that order), then the text column with the most room wraps at
    word boundaries onto continuation lines (issue 46: `ddptop presets` was 135 columns wide)."""
    # every plain-text table (ls, trace, headless, sweep) shows its cells as text: names from
    # files and ranks can hold escapes
    heads: list[str] = [printable(str(h)) for h in headers]
    body: list[list[str]] = [[printable(str(c)) for c in row] for row in rows]
    widths = _widths(heads, body)
    for name in drop:
        if width is None or _span(widths) <= width or name not in heads:
            continue
        i = heads.index(name)
        heads, body = heads[:i] + heads[i + 1:], [r[:i] + r[i + 1:] for r in body]
        widths = _widths(heads, body)
    numeric = [all(_is_number(r[i]) for r in body) for i in range(len(heads))]
    if width is not None and _span(widths) > width:
        texts = [i for i in range(len(heads)) if not numeric[i]]
        floor = {i: max([len(heads[i])] + [len(w) for r in body for w in r[i].split()]) for i in texts}
        while texts and _span(widths) > width:
            i = max(texts, key=lambda k: widths[k] - floor[k])
            if widths[i] <= floor[i]:
                break  # no column narrower than its longest word: a line too long beats a cut word
            widths[i] -= 1

    def lines(row: list[str]) -> list[str]:
        cols = [textwrap.wrap(c, w, break_on_hyphens=False) or [""] if len(c) > w else [c]
                for c, w in zip(row, widths)]
        out = []
        for k in range(max(len(c) for c in cols)):
            parts = [c[k] if k < len(c) else "" for c in cols]
            out.append("  ".join(x.rjust(w) if num else x.ljust(w)
                                 for x, w, num in zip(parts, widths, numeric)).rstrip())
        return out

    shown = [line for row in body for line in lines(row)]
    return "\n".join([*lines(heads), *lines(["-" * w for w in widths]), *shown])


def _widths(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[int]:
    return [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]


def _span(widths: Sequence[int]) -> int:
    return sum(widths) + 2 * (len(widths) - 1)


def markdown_grid(headers: Sequence[str], cells: Sequence[Sequence[str]], numeric: Sequence[bool]) -> str:
    """The one Markdown table: GitHub Markdown, padded so it also reads as plain text;
    `numeric` columns right-aligned; a `|` inside a cell is escaped."""
    cells = [[c.replace("|", "\\|") for c in row] for row in cells]
    widths = [max(len(x) for x in [h, *(c[i] for c in cells)]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        padded = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return "| " + " | ".join(padded) + " |"

    rule = ["-" * (w - 1) + ":" if num else "-" * w for w, num in zip(widths, numeric)]
    return "\n".join([line(headers), line(rule), *(line(c) for c in cells)])


def _is_number(cell: str) -> bool:
    try:
        float(cell.rstrip("x%"))
    except ValueError:
        return cell in ("n/a", "-")
    return True


def presets_table(width: int | None = None) -> str:
    rows = []
    for name, preset in PRESETS.items():
        cfg = preset_config(name, RunConfig(nproc=2))
        rows.append([name, cfg.describe(), preset.description])
    return table(["preset", "settings", "what it is for"], rows, width)


def status_line(state: RunState, now: float) -> str:
    """The headless status line, from the same Snapshot the TUI shows."""
    snap = snapshot(state, now)
    steps = state.config.total_steps
    connected = figures.ranks_connected(state.ranks.values())
    parts = [f"[{state.elapsed(now):6.1f}s]", f"{state.status:<9}"]
    if state.status == RunStatus.STARTING:
        parts.append(f"ranks {connected}/{state.world_size} connected" if connected < state.world_size
                     else f"all {connected} ranks connected: waiting for the first step")
        if connected and state.notes:  # why none may come (training in mp.spawn children, no torch.optim)
            parts.append(f"note: {state.notes[-1]}")
    else:
        parts += [
            f"step {max(state.current_step + 1, 0)}" + (f"/{steps}" if steps else ""),
            f"{fmt_step_rate(snap.steps_per_s)} steps/s",
            f"{fmt(snap.samples_per_s_run, '.1f')} samples/s",
            f"p50 {fmt(snap.p50_ms)} ms",
        ]
        if snap.comm is not None:
            total, exposed = snap.comm
            parts.append(f"exposed comm {100 * (exposed or 0.0):.0f}%" if total is None
                         else f"comm {100 * total:.0f}% (exposed {100 * (exposed or 0.0):.0f}%; {snap.comm_window})")
        if snap.verdict_text:  # the one wording every view shows
            parts.append(snap.verdict_text)
        if snap.stall is not None:
            parts.append(f"STALLED since {now - snap.stall.since:.0f}s, suspects {snap.stall.suspects}")
    if state.total_dropped:
        parts.append(f"dropped frames {state.total_dropped}")
    if state.error and not state.finished:
        parts.append(f"ERROR: {state.error}")
    return printable("  ".join(parts))


def ranks_table(summary: dict[str, Any], width: int | None = None) -> str:
    """Each rank as the live view's rank table shows it on its final screen: its last 50 steps
    (p50, p95, own ms, the phases with the exposed wait apart from backward, samples/s) and the
    straggler flagged in its status; a summary without those (an older ddptop's) gives its
    whole-run figures."""
    multi, named, rows = (summary.get("nnodes") or 1) > 1, (summary.get("straggler") or {}).get("rank"), []  # multi: hostnames may repeat
    timed = "" if (every := timed_every(r.get("info") or {} for r in summary["ranks"])) == 1 else f"; one step in {every} timed (phase_every)"
    for r in summary["ranks"]:
        recent = r.get("last50") or {}
        ph = recent.get("phases_ms") or r["phases_ms"]
        node = ["-" if r.get("node") is None else r["node"]] if multi else []
        status = "straggler" if named == r["rank"] and r["status"] in ("running", "done") else r["status"]
        rows.append([
            r["rank"], *node, r["host"] or "-", r["device"] or "-",
            r["steps"] if every == 1 else f"{r.get('timed_steps', r['steps'])} of {r['steps']}",  # timed of those run
            fmt(recent.get("p50_ms", r["step_ms_p50"])), fmt(recent.get("p95_ms", r["step_ms_p95"])),
            fmt(recent.get("own_ms")), fmt(ph["data"]), fmt(ph["forward"]), fmt(ph["backward"]),
            fmt(ph.get("exposed")), fmt(ph["optimizer"]),
            fmt(recent.get("samples_per_s", r["samples_per_s"])), status,
        ])
    window = f"last 50 {'timed ' if timed else ''}steps each, as the live view shows them{timed}" if any(
        r.get("last50") for r in summary["ranks"]) else f"each rank's run{timed}"
    head = ["rank", *(["node"] if multi else []), "host", "device", "steps", "p50 ms", "p95 ms", "own ms",
            "data", "fwd", "bwd", "exposed", "opt", "samples/s", "status"]
    title = f"ranks, {window} (ms a step):"
    return (wrapped(title, width) if width else title) + "\n" + table(head, rows, width, drop=("host", "device", "p95 ms", "steps", "samples/s"))


def what_ran(summary: dict[str, Any]) -> str:
    """`preset bf16` for ddptop's trainer; the command and the model it built for a script."""
    command = summary.get("command")
    if not command:
        return f"preset {summary['preset']}"
    text = " ".join(command)
    return "script " + (text if len(text) <= 60 else text[:57] + "...")


def script_ddp(info: dict[str, Any]) -> dict[str, str]:
    """What a user's script's DDP asked for, what ddptop changed and what was in effect,
    as the rank's instrument read them off its DDP object; empty when it built none."""
    if "static_graph" not in info:
        return {}
    parts = [f"static_graph={info.get('static_graph')}",
             f"gradient_as_bucket_view={info.get('gradient_as_bucket_view')}"]
    if isinstance(info.get("bucket_cap_mb"), (int, float)):
        parts.append(f"bucket_cap_mb={info['bucket_cap_mb']:g}")
    if info.get("comm_hook"):
        parts.append(f"hook {info['comm_hook']}")
    if info.get("autocast") not in (None, "none"):
        parts.append(f"autocast {info['autocast']}")
    out = {"in effect": ", ".join(parts)}
    if info.get("ddp_asked"):
        out["asked"] = str(info["ddp_asked"])
    if info.get("ddp_set"):
        out["set"] = str(info["ddp_set"])
    return out


def script_ddp_lines(summary: dict[str, Any]) -> list[str]:
    """For a user's script: its DDP as asked, as changed by ddptop, as in effect (rank 0's,
    and any rank whose DDP differs)."""
    if not summary.get("command"):
        return []
    seen: dict[tuple, list[int]] = {}
    for r in summary.get("ranks") or []:
        ddp = script_ddp(r.get("info") or {})
        if ddp:
            seen.setdefault(tuple(sorted(ddp.items())), []).append(r["rank"])
    lines = []
    for key, ranks in seen.items():
        ddp = dict(key)
        who = "every rank" if len(seen) == 1 else "rank" + ("s " if len(ranks) > 1 else " ") + ",".join(map(str, ranks))
        lines.append(f"DDP ({who}): the script asked {ddp.get('asked', 'n/a')}; ddptop set "
                     f"{ddp.get('set', 'nothing')}; in effect {ddp['in effect']}")
    return lines


def final_report(summary: dict[str, Any], run_dir: str, width: int | None = None, wrap: bool = False) -> str:
    """The exit summary; `width` (the terminal's): its table fits, and with `wrap` (a terminal,
    which would break a long line mid-word) its prose wraps at words; piped, a finding stays
    one line (grep finds it)."""
    params = summary.get("params")
    head = (
        f"run {summary['run_id']}: {summary['status']}"
        f"{' (' + summary['error'] + ')' if summary.get('error') else ''}  "
        f"{what_ran(summary)}  world {summary['world_size']}  backend {summary['backend']}  "
        f"model {summary['model']}" + (f" ({params / 1e6:.1f}M params)" if params else "")
        + (f"  batch {summary['batch_size']}/rank" if summary.get("batch_size") else "")
    )
    rates = (
        f"{fmt_step_rate(summary['steps_per_s'])} steps/s  {fmt(summary['samples_per_s'], '.1f')} samples/s  "
        + (f"{fmt(summary['tokens_per_s'], '.0f')} tokens/s  " if summary.get("tokens_per_s") else "")
        + f"step p50 {fmt(summary['step_ms_p50'])} ms  p95 {fmt(summary['step_ms_p95'])} ms  "
        f"(after {summary['warmup']} warmup steps)"
    )
    lines = [head, *script_ddp_lines(summary), rates, ranks_table(summary, width)]
    lines += comm_lines(summary) + eval_lines(summary) + cost_lines(summary)
    verdict = summary.get("straggler_check") or summary.get("straggler")  # older summaries: the latter
    if verdict:
        lines.append(verdict["text"])
    for note in summary.get("notes") or []:
        lines.append(f"note: {note}")
    if summary.get("stalls"):
        cause = (summary.get("stall") or {}).get("cause")
        lines.append(f"stalls: {summary['stalls']} (stacks in stacks/)" + (f"; last one: {cause}" if cause else ""))
    if summary.get("advice"):
        lines.append(advice_line(summary["advice"]))
    for cap in summary.get("captures") or []:
        comm = (cap.get("summary") or {}).get("comm_ms_mean")
        agree = (cap.get("summary") or {}).get("timer_vs_trace_mean")
        hook = (cap.get("summary") or {}).get("timer_vs_trace_hook_mean")  # under a comm hook: like with like
        lines.append(f"capture {cap['id']} steps {cap['steps']} ({cap['profiler']}): {cap['status']}"
                     f"{', comm ' + format(comm, '.1f') + ' ms/rank' if comm is not None else ''}"
                     f"{f' (ddptop timer / trace = {agree:.2f}' if agree is not None else ''}"
                     f"{f'; hook span {hook:.2f}' if agree is not None and hook is not None else ''}"
                     f"{')' if agree is not None else ''}"
                     f"{' ' + cap['error'] if cap.get('error') else ''} -> {cap['dir']}")
        said = perturbation_line((cap.get("summary") or {}).get("perturbation"))
        if said:
            warm = cap.get("warmup")
            lines.append(f"  {said}" + (f"; the profiler warmed up {warm} step(s) before recording" if warm else ""))
    if summary.get("failed_rank") is not None:
        tail = summary.get("failure_log") or []
        lines.append(f"failed rank: {summary['failed_rank']}"
                     + (f"; the end of its stderr (logs/.../{summary['failed_rank']}/stderr.log):" if tail else ""))
        lines += [f"  | {line}" for line in tail]
    if summary.get("dropped_frames"):
        lines.append(f"dropped telemetry frames: {summary['dropped_frames']}")
    if width and wrap:
        lines = [wrapped(x, width) for x in lines]
    lines.append(f"records: {run_dir}")  # whole, however long: the path is what a reader copies
    # a summary.json read back may hold a rank's raw bytes (an older ddptop's, or edited)
    return printable("\n".join(lines), newlines=True)


def wrapped(text: str, width: int) -> str:
    """A report's prose at `width`, broken at word boundaries, continuation lines indented;
    multi-line text (a table) is left as it is."""
    if "\n" in text or len(text) <= width:
        return text
    indent = " " * (len(text) - len(text.lstrip()) + 2)
    return "\n".join(textwrap.wrap(text, width, subsequent_indent=indent, break_long_words=False,
                                   break_on_hyphens=False))


def advice_line(advice: dict[str, Any]) -> str:
    """`advice (measured): ...`, or a prediction, whose reason starts with its own label (an
    older summary's advice, which has none, was a rule's prediction too)."""
    reason = str(advice.get("reason") or "")
    label = str(advice.get("label") or "expected, not measured yet")
    said = reason.lower().startswith(label.split(" (")[0])
    return f"advice{'' if said else f' ({label})'}: {reason}"


def closing_lines(state: RunState, run_dir: str | os.PathLike[str], summary: dict[str, Any] | None = None,
                  width: int | None = None, wrap: bool = False) -> str:
    """What a finished run prints last, headless or after the TUI: status, the final
    table, where the records are; `width`, `wrap`: final_report's."""
    return final_report(summary if summary is not None else state.summary(), str(run_dir), width, wrap)


def cost_lines(summary: dict[str, Any]) -> list[str]:
    """`--set cost_ab`: what ddptop's rank-side layer cost this run, each arm against bypassed."""
    cost = summary.get("cost")
    if not cost:
        return []
    arms = len(cost["arms"]) + 1  # and off
    lines = [f"ddptop's own cost (engaged vs bypassed inside this run, {cost['groups']} groups, "
             f"bypassed step {cost['step_ms']:.2f} ms; the figures above are the engaged steps', "
             f"1 in {arms} of the measured steps):"]
    for arm in cost["arms"]:
        r, ms = arm["ratio"], arm["ms_per_step"]
        lines.append(f"  {arm['arm']:<4} {1000 * ms['median']:+.0f} us a step per rank [{1000 * ms['lo']:+.0f}, "
                     f"{1000 * ms['hi']:+.0f}], ratio {r['median']:.4f} [{r['lo']:.4f}, {r['hi']:.4f}]: {arm['verdict']}")
    lines.append("  (the rank-side hooks' share only: what is on in every arm (NCCL's timing and hook, the plugin, "
                 "torchrun's log capture, the monitor) is not in it; `ddptop cost -- CMD` measures the whole "
                 "against plain torchrun)")
    return lines


def eval_lines(summary: dict[str, Any]) -> list[str]:
    """Forwards without grad (validation, generation): time a step spends in them, which the
    four phases leave out; nothing when the script ran none."""
    evals = [(r["rank"], r["eval_ms_mean"]) for r in summary.get("ranks") or [] if r.get("eval_ms_mean")]
    if not evals:
        return []
    values = [v for _, v in evals]
    per_rank = f"{min(values):.1f}-{max(values):.1f}" if len(values) > 1 else f"{values[0]:.1f}"
    return [f"validation/no-grad forwards: {per_rank} ms a step (not in the phases; mean over the measured steps, "
            f"rank{'s' if len(evals) > 1 else ''} {','.join(str(r) for r, _ in evals)})"]


def comm_lines(summary: dict[str, Any]) -> list[str]:
    """The gradient communication lines of the final report."""
    lines: list[str] = []
    if summary.get("comm_share") is not None:
        busbw = [r.get("busbw_gbps") for r in summary["ranks"] if r.get("busbw_gbps") is not None]
        lines.append(f"gradient communication: {100 * summary['comm_share']:.1f}% of the step, "
                     f"{100 * (summary.get('exposed_comm_share') or 0):.1f}% exposed (not hidden by backward; "
                     f"{summary.get('comm_window') or 'run'})"
                     + (f"; all-reduce bus bandwidth {min(busbw):.2f}-{max(busbw):.2f} GB/s" if busbw else "")
                     + (" (effective: the gradient's bytes before compression over the compressed collectives' "
                        "time, so it can exceed the link)" if any(r.get("busbw_effective") for r in summary["ranks"]) else ""))
        lines += clock_lines(summary)
        hooked = [r for r in summary["ranks"] if r.get("hook_ms_p50") is not None and r.get("comm_ms_p50") is not None]
        if hooked:  # the comm hook's own work (cast, divide, decompress) beside its collectives
            lines.append("comm hook, p50 per rank: " + ", ".join(
                f"rank {r['rank']} {r['hook_ms_p50']:.1f} ms, of which collectives {r['comm_ms_p50']:.1f} ms"
                for r in hooked))
        lines += ddp_cross_check(summary)
    elif summary.get("exposed_comm_share") is not None:
        switch = figures.timing_switch(summary)
        how = (f"{switch} is off by default: --set {switch}=true times "
               + ("each bucket, at ~60 us a bucket" if switch == "gloo_timing" else "it, at ~1.4% of a ViT-L step"))
        lines.append(f"gradient communication: {100 * summary['exposed_comm_share']:.1f}% of the step exposed "
                     f"(not hidden by backward); the all-reduce total is not timed here ({how})")
    return lines


def ddp_cross_check(summary: dict[str, Any]) -> list[str]:
    """DDP's own logger beside ddptop's figures, compared like with like: DDP's comm span
    runs from the first bucket's hand-over to the last all-reduce's end (queueing behind
    backward's kernels included) and averages sampled iterations from the first on (NCCL's
    set-up included), so its total is not ddptop's in-flight time; the part it did not
    overlap with compute is the figure to hold against ddptop's exposed comm."""
    ddp = next((r for r in summary["ranks"] if r.get("ddp_timing")), None)
    if ddp is None or "backward_comm_ms" not in ddp["ddp_timing"]:
        return []
    t = ddp["ddp_timing"]
    total, overlap = t["backward_comm_ms"], t.get("overlap_ms")
    alone = None if overlap is None else max(0.0, total - overlap)
    return [f"cross-check, rank {ddp['rank']}: DDP's own logger (a mean over sampled iterations up to "
            f"{fmt(t.get('iteration'), '.0f')}, warm-up included) not overlapped with compute "
            f"{fmt(alone, '.1f')} ms; ddptop exposed p50 {fmt(ddp.get('exposed_comm_ms_p50'), '.1f')} ms "
            f"(after warmup)",
            f"  DDP's comm span {fmt(total, '.1f')} ms runs from the first bucket's hand-over to the last "
            f"all-reduce's end ({fmt(overlap, '.1f')} ms of it under backward's compute); ddptop's all-reduce "
            f"p50 {fmt(ddp.get('comm_ms_p50'), '.1f')} ms is the collectives' own time"]


def clock_lines(summary: dict[str, Any]) -> list[str]:
    """Whose clock the all-reduce times are (each rank says, in its facts), and what it missed."""
    said: dict[str, list[int]] = {}
    missed = []
    for r in summary["ranks"]:
        info = r.get("info") or {}
        if info.get("comm_clock"):
            said.setdefault(str(info["comm_clock"]), []).append(int(r["rank"]))
        if info.get("comm_clock_missed"):
            missed.append(f"rank {r['rank']}: {info['comm_clock_missed']}")
    if len(said) == 1:
        lines = [f"all-reduce time: {next(iter(said))}"]
    else:
        lines = [f"all-reduce time, rank{'s' if len(ranks) > 1 else ''} {','.join(map(str, ranks))}: {text}"
                 for text, ranks in said.items()]
    return lines + missed
