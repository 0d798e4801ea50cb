"""`ddptop tune`: search DDP settings (comm hook, PowerSGD rank, bucket size, static graph,
bucket view) within a wall-clock budget and report the fastest configuration found.

It runs `baseline` first, asks the advisor (its reading of the baseline run: comm share,
NCCL transports, NVLink) where to start, always runs the advisor's presets (so the result is
never slower than the best of them), then walks best-first: one knob at a time around the
fastest configuration so far. Runs go through `ddptop.commands.sweep.run_sweep`, one config at a time.

With `-- CMD` it tunes the user's own script: the first run is the script as it is (`asis`,
its DDP arguments read back from its DDP object are where the search starts), every later run
sets all the tuned knobs on the script's DDP, and no run starts that the budget cannot hold.

The search space, neighbours, ranking, command line and table are pure functions; only
`run_tune` and `main_tune` start anything. Must not import torch or textual.
"""

from __future__ import annotations

import argparse
import heapq
import io
import itertools
import json
import shlex
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ddptop.analysis.advisor import LADDER, LOSSY_CAVEAT, NOISE, Advice, advise_run
from ddptop.commands.sweep import (
    SCRIPT_STEPS,
    add_batch_args,
    build_configs,
    build_rows,
    check_runnable,
    progress_line,
    rank_info,
    ratio_text,
    run_sweep,
    share_text,
    split_command,
    steps_text,
)
from ddptop.model.config import PRESETS, ConfigError, RunConfig, parse_value, validate
from ddptop.model.report import fmt
from ddptop.model.usage import USAGE_EXIT, OneLineParser, UsageError

# The knobs the tuner searches, and the values it tries. Order matters: it is the order in
# which a knob's values are neighbours of each other (bucket sizes) and the table's order.
TUNE_KNOBS = (
    "comm_hook",
    "powersgd_rank",
    "bucket_cap_mb",
    "static_graph",
    "gradient_as_bucket_view",
)
HOOKS = ("none", "bf16", "fp16", "powersgd")
POWERSGD_RANKS = (1, 2, 4)
BUCKETS_MB = (25.0, 50.0, 100.0, 200.0, 2000.0)
# Presets the tuner can start from or name in its command line: DDP settings only (not
# `single`, no DDP; not `amp`, whose autocast changes the compute, not the communication).
TUNE_PRESETS = tuple(p for p in PRESETS if p not in ("single", "amp", "asis"))

Point = dict[str, Any]  # one value per TUNE_KNOBS


# ---------------------------------------------------------------------------- search space (pure)


def normalize(point: Mapping[str, Any]) -> Point:
    """The point with knobs that do nothing reset (PowerSGD rank without PowerSGD), so
    equal behaviour means equal points."""
    out = {k: point[k] for k in TUNE_KNOBS}
    out["bucket_cap_mb"] = float(out["bucket_cap_mb"])
    if out["comm_hook"] != "powersgd":
        out["powersgd_rank"] = RunConfig().powersgd_rank
    return out


def point_of(config: RunConfig) -> Point:
    return normalize({k: getattr(config, k) for k in TUNE_KNOBS})


def point_key(point: Mapping[str, Any]) -> tuple[Any, ...]:
    p = normalize(point)
    return tuple(p[k] for k in TUNE_KNOBS)


def preset_point(name: str) -> Point:
    defaults = RunConfig()
    settings = PRESETS[name].settings
    return normalize({k: settings.get(k, getattr(defaults, k)) for k in TUNE_KNOBS})


def _adjacent(values: Sequence[float], current: float) -> list[float]:
    """The values next to `current` in `values` (the two nearest when it is not there)."""
    if current in values:
        i = values.index(current)
        return [values[j] for j in (i - 1, i + 1) if 0 <= j < len(values)]
    below = [v for v in values if v < current]
    above = [v for v in values if v > current]
    return ([below[-1]] if below else []) + ([above[0]] if above else [])


@dataclass(frozen=True)
class Move:
    """One neighbour: the point, the knob changed (`from` -> `to`), and a prior (lower is
    tried first among neighbours of the same configuration)."""

    point: dict[str, Any]
    knob: str
    old: Any
    new: Any
    prior: int

    def describe(self) -> str:
        return f"{self.knob} {_show(self.old)}->{_show(self.new)}"


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def neighbours(
    point: Mapping[str, Any], fixed: Iterable[str] = (), compress_first: bool = False
) -> list[Move]:
    """Every configuration one knob away from `point`, best guesses first. Knobs in `fixed`
    (the user set them with --set) never change. `compress_first`: the advisor says the
    run is communication-bound, so hooks come before buckets."""
    fixed = set(fixed)
    p = normalize(point)
    moves: list[Move] = []

    def add(knob: str, new: Any, prior: int, **also: Any) -> None:
        q = normalize({**p, knob: new, **also})
        if point_key(q) != point_key(p):
            moves.append(Move(q, knob, p[knob], new, prior))

    hook_prior, bucket_prior = (0, 1) if compress_first else (1, 0)
    if "comm_hook" not in fixed:
        for hook in HOOKS:
            if hook != p["comm_hook"]:
                add("comm_hook", hook, hook_prior + (2 if hook == "fp16" else 0))
    if p["comm_hook"] == "powersgd" and "powersgd_rank" not in fixed:
        for rank in _adjacent(POWERSGD_RANKS, p["powersgd_rank"]):
            add("powersgd_rank", int(rank), hook_prior)
    if "bucket_cap_mb" not in fixed:
        for mb in _adjacent(BUCKETS_MB, p["bucket_cap_mb"]):
            add("bucket_cap_mb", mb, bucket_prior)
    for knob in ("static_graph", "gradient_as_bucket_view"):
        if knob not in fixed:
            add(knob, not p[knob], 0 if not p[knob] else 3)  # turning them off rarely helps
    return sorted(moves, key=lambda m: m.prior)


def nearest_preset(
    point: Mapping[str, Any], presets: Sequence[str] = TUNE_PRESETS
) -> tuple[str, dict[str, Any]]:
    """The preset closest to `point` (fewest knobs differ; ties: the earlier preset) and the
    knobs to change on top of it."""
    p = normalize(point)
    best: tuple[str, dict[str, Any]] | None = None
    for name in presets:
        q = preset_point(name)
        diff = {k: p[k] for k in TUNE_KNOBS if p[k] != q[k]}
        if best is None or len(diff) < len(best[1]):
            best = (name, diff)
    assert best is not None
    return best


def preset_name(point: Mapping[str, Any]) -> str:
    """The preset this point is exactly, else "custom"."""
    key = point_key(point)
    return next((n for n in TUNE_PRESETS if point_key(preset_point(n)) == key), "custom")


def _set_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return _show(value)


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


def point_read_back(summary: Mapping[str, Any]) -> Point | None:
    """A script run's tuned knobs as its DDP had them (the instrument read them back after
    DDP() returned); comm_hook `none` when the script registered no compression hook."""
    info = rank_info(summary)
    if not info or not isinstance(info.get("bucket_cap_mb"), (int, float)):
        return None
    hook = str(info.get("comm_hook") or "")
    named = {"bf16_compress_hook": "bf16", "fp16_compress_hook": "fp16", "powerSGD_hook": "powersgd"}
    return normalize({
        "comm_hook": named.get(hook, "none"),
        "powersgd_rank": RunConfig().powersgd_rank,
        "bucket_cap_mb": float(info["bucket_cap_mb"]),
        "static_graph": bool(info.get("static_graph")),
        "gradient_as_bucket_view": bool(info.get("gradient_as_bucket_view")),
    })


def is_lossy(point: Mapping[str, Any]) -> bool:
    return point.get("comm_hook", "none") != "none"


# ---------------------------------------------------------------------------- trials and ranking (pure)


@dataclass
class Trial:
    """One configuration tried: where it came from and what its run measured."""

    index: int
    point: dict[str, Any]
    source: str  # "baseline", "advisor: overlap", "preset powersgd", "#3 + bucket_cap_mb 100->50"
    summary: dict[str, Any] = field(default_factory=dict)
    run_dir: str = ""
    wall_s: float = 0.0
    label: str = ""  # the config's name in the table when not its preset's (asis: a script as it is)

    @property
    def rate(self) -> float | None:
        if self.summary.get("status") != "completed":
            return None
        return self.summary.get("steps_per_s") or None


def rank_trials(trials: Sequence[Trial]) -> list[Trial]:
    """Completed trials, fastest first (ties: the earlier trial)."""
    done = [t for t in trials if t.rate is not None]
    return sorted(done, key=lambda t: (-(t.rate or 0.0), t.index))


def best_trial(trials: Sequence[Trial], lossless: bool = False) -> Trial | None:
    ranked = [t for t in rank_trials(trials) if not (lossless and is_lossy(t.point))]
    return ranked[0] if ranked else None


def baseline_rate(trials: Sequence[Trial]) -> float | None:
    return next((t.rate for t in trials if t.source == "baseline"), None)


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
    numeric = [h in ("#",) or i >= 5 for i, h in enumerate(HEADERS)]
    widths = [max(len(x) for x in [h, *(c[i] for c in cells)]) for i, h in enumerate(HEADERS)]

    def line(values: Sequence[str]) -> str:
        padded = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return "| " + " | ".join(padded) + " |"

    rule = ["-" * (w - 1) + ":" if num else "-" * w for w, num in zip(widths, numeric)]
    return "\n".join([line(HEADERS), line(rule), *(line(c) for c in cells)])


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


def command_line_asis(nproc: int, extra_sets: Sequence[str], user_cmd: Sequence[str]) -> str:
    sets = [x for pair in extra_sets for x in ("--set", pair)]
    return " ".join(["ddptop", "--nproc", str(nproc), *sets, "--", *(shlex.quote(a) for a in user_cmd)])


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


# ---------------------------------------------------------------------------- the search


def seed_sources(advice: Advice | None) -> list[tuple[str, str]]:
    """(preset, why) to run right after baseline: the advisor's pick first, then the rest of
    its ladder (overlap, bf16-overlap, powersgd), so the result is never slower than any
    preset the advisor could recommend."""
    out: list[tuple[str, str]] = []
    if advice is not None and advice.preset in TUNE_PRESETS and advice.preset != "baseline":
        out.append((advice.preset, f"advisor: {advice.preset}"))
    for name in LADDER:
        if all(name != n for n, _ in out):
            out.append((name, f"preset {name}"))
    return out


def compress_first(advice: Advice | None) -> bool:
    return advice is not None and advice.lossy


@dataclass
class TuneResult:
    trials: list[Trial] = field(default_factory=list)
    advice: Advice | None = None
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)


class Tuner:
    """Best-first search. Each finished trial queues its neighbours with the trial's
    steps/s as priority, so the neighbours of the fastest configuration so far go first."""

    # what a tuned point sets on a user's script's DDP: every tuned knob (a knob left out would
    # be the script's own value, and the point would not be what ran)
    SCRIPT_APPLY = (*TUNE_KNOBS, "powersgd_start_iter")

    def __init__(self, base: RunConfig, fixed: Iterable[str] = ()) -> None:
        self.base = base
        self.fixed = frozenset(fixed)
        self.seen: set[tuple[Any, ...]] = set()
        self._queue: list[tuple[float, int, int, Move, int]] = []
        self._order = itertools.count()

    def config_for(self, point: Mapping[str, Any]) -> RunConfig:
        p = normalize(point)
        for k in self.fixed:  # the user's --set wins over the search
            p[k] = getattr(self.base, k)
        extra: dict[str, Any] = {}
        if self.base.script:
            extra["ddp_apply"] = ",".join([*self.base.applied, *self.SCRIPT_APPLY])
        return validate(self.base.with_changes(**p, **extra, preset=preset_name(p)))

    def fix(self, point: Mapping[str, Any]) -> Point:
        return point_of(self.config_for(point))

    def visit(self, point: Mapping[str, Any]) -> bool:
        """Mark `point` as tried; False when it (or its equal) already was."""
        key = point_key(self.fix(point))
        if key in self.seen:
            return False
        self.seen.add(key)
        return True

    def expand(self, trial: Trial, compress: bool) -> None:
        if trial.rate is None:
            return
        for move in neighbours(trial.point, self.fixed, compress):
            if point_key(move.point) not in self.seen:
                heapq.heappush(
                    self._queue, (-trial.rate, move.prior, next(self._order), move, trial.index)
                )

    def next_move(self) -> tuple[Move, int] | None:
        while self._queue:
            _, _, _, move, parent = heapq.heappop(self._queue)
            if point_key(move.point) not in self.seen:
                return move, parent
        return None


def run_one(
    config: RunConfig, tune_dir: Path, user_cmd: Sequence[str] | None = None
) -> tuple[dict[str, Any], str, bool]:
    """One run through the sweep's runner: (summary, run dir, interrupted)."""
    result = run_sweep([config], tune_dir, out=io.StringIO(), user_cmd=user_cmd)
    return result.summaries[0], result.run_dirs[0], result.interrupted


def run_tune(
    base: RunConfig,
    tune_dir: Path,
    budget_s: float,
    fixed: Iterable[str] = (),
    out: TextIO | None = None,
    runner: Any = run_one,
    clock: Any = time.monotonic,
) -> TuneResult:
    """Baseline, the advisor's presets, then best-first search while the budget lasts (a
    run is not started when the mean run time so far would overshoot it). `runner` and
    `clock` are injectable for tests.

    A user's script (base.script): the baseline is the script as it is (its own DDP
    arguments, read back, are the point the search starts from), and no run after it starts
    when the longest run so far would overshoot the budget, the advisor's presets included:
    a script's run time is not ddptop's to know."""
    out = out or sys.stdout
    tuner = Tuner(base, fixed)
    result = TuneResult()
    started = clock()
    strict = base.script

    def attempt(point: Mapping[str, Any], source: str, config: RunConfig | None = None,
                label: str = "") -> Trial | None:
        if config is None:
            if not tuner.visit(point):
                return None
            config = tuner.config_for(point)
        trial = Trial(len(result.trials) + 1, point_of(config), source, label=label)
        print(
            f"[{trial.index:>2}] {config.preset:<12} {config.describe():<44} {source:<34} ",
            end="",
            file=out,
            flush=True,
        )
        t0 = clock()
        try:
            trial.summary, trial.run_dir, interrupted = runner(config, tune_dir)
        except KeyboardInterrupt:
            trial.summary = {
                "status": "stopped",
                "error": "interrupted",
                "config": config.to_dict(),
            }
            interrupted = True
        trial.wall_s = clock() - t0
        result.trials.append(trial)
        result.interrupted = result.interrupted or interrupted
        print(progress_line({**trial.summary, "elapsed_s": trial.wall_s}), file=out, flush=True)
        return trial

    def budget_left() -> bool:
        walls = [t.wall_s for t in result.trials]
        estimate = (max(walls) if strict else sum(walls) / len(walls)) if walls else 0.0
        return clock() - started + estimate <= budget_s

    if base.script:
        base_trial = attempt({}, "baseline", config=base, label="asis")
        if base_trial is not None:
            read = point_read_back(base_trial.summary)
            if read is not None:
                base_trial.point = read
                tuner.visit(read)
    else:
        base_trial = attempt(preset_point("baseline"), "baseline")
    if base_trial is None or result.interrupted:
        return result
    if base_trial.rate is None:
        result.notes.append(
            "the baseline run did not complete: nothing to compare against; search skipped"
        )
        return result
    result.advice = advice_for(base_trial.summary)
    compress = compress_first(result.advice)
    tuner.expand(base_trial, compress)
    seeds = seed_sources(result.advice)
    for name, why in seeds:
        if strict and not budget_left():
            break
        trial = attempt(preset_point(name), why)
        if result.interrupted:
            return result
        if trial is not None:
            tuner.expand(trial, compress)
    if not budget_left():
        ran = len(result.trials) - 1
        result.notes.append(
            f"the baseline and the advisor's presets took the whole budget ({budget_s:g}s): "
            "no search around them; give a larger --budget"
            if ran >= len(seeds)
            else f"the budget ({budget_s:g}s) held the baseline and {ran} of the advisor's "
            f"{len(seeds)} presets: no search; give a larger --budget"
        )
    while budget_left():
        nxt = tuner.next_move()
        if nxt is None:
            result.notes.append("search space around the best configurations exhausted")
            break
        move, parent = nxt
        trial = attempt(move.point, f"#{parent} + {move.describe()}")
        if result.interrupted:
            break
        if trial is not None:
            tuner.expand(trial, compress)
    return result


def advice_for(summary: Mapping[str, Any]) -> Advice | None:
    """The advisor's reading of the baseline run: the one its session computed (with the
    NCCL report and NVML topology it had), else `advise_run` on the summary alone."""
    data = summary.get("advice")
    if isinstance(data, Mapping) and "preset" in data:
        return Advice(
            data["preset"],
            dict(data.get("changes") or {}),
            data.get("reason", ""),
            data.get("severity", "info"),
            list(data.get("evidence") or []),
            bool(data.get("lossy")),
        )
    try:
        return advise_run(summary)
    except Exception:  # noqa: BLE001 - no advice only changes where the search starts
        return None


# ---------------------------------------------------------------------------- command line


def tune_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="ddptop tune",
        description="Search DDP settings (comm hook, PowerSGD rank, bucket size, static graph, bucket view) "
        "within a time budget, starting from the advisor's reading of a baseline run; print the tried "
        "configs and the fastest as a command line, and write tune.json + tune.md.",
    )
    p.add_argument(
        "--nproc", type=int, help="ranks on this node (default: GPUs seen by NVML, else 2)"
    )
    p.add_argument(
        "--steps",
        type=int,
        help="optimizer steps per rank, every run (a script: steps after warmup, default "
        f"{SCRIPT_STEPS}; it is stopped at an agreed step)",
    )
    p.add_argument("--warmup", type=int, help="steps left out of throughput figures")
    p.add_argument(
        "--budget",
        type=float,
        default=600.0,
        help="seconds of wall clock for the search (default 600); baseline and the advisor's "
        "presets always run, the search around them stops when the budget is spent",
    )
    add_batch_args(p, "tune", "a tuned knob set here stays fixed")
    return p


def fixed_knobs(overrides: Sequence[str]) -> set[str]:
    """Tuned knobs the user pinned with --set."""
    out = set()
    for pair in overrides:
        key = pair.split("=", 1)[0].strip()
        if key in TUNE_KNOBS:
            out.add(key)
    return out


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, RunConfig]:
    """Arguments and the baseline config; UsageError/ConfigError before anything runs. The
    user's command after `--`, if any, is `args.user_cmd`."""
    own, user_cmd = split_command(argv)
    args = tune_parser().parse_args(own)
    args.user_cmd = user_cmd
    if args.budget <= 0:
        raise UsageError(f"--budget must be positive, got {args.budget:g}")
    for pair in args.overrides:
        if "=" in pair:
            key, raw = pair.split("=", 1)
            if key.strip() == "ddp" and parse_value("ddp", raw)[1] is False:
                raise UsageError("ddptop tune needs DDP: --set ddp=false leaves nothing to tune")
    ns = argparse.Namespace(
        presets="asis" if user_cmd else "baseline",
        nproc=args.nproc,
        steps=args.steps,
        warmup=args.warmup,
        overrides=args.overrides,
    )
    (base,) = build_configs(ns, script=user_cmd is not None)
    if base.world_size < 2:
        raise UsageError(f"ddptop tune needs at least 2 ranks, got --nproc {base.nproc}")
    check_runnable([base], args.runs_dir)
    return args, base


def _tune_dir(runs_dir: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = runs_dir / f"tune-{stamp}"
    n = 1
    while path.exists():
        n += 1
        path = runs_dir / f"tune-{stamp}-{n}"
    path.mkdir(parents=True, mode=0o700)
    return path


def main_tune(argv: Sequence[str]) -> int:
    try:
        args, base = parse_args(argv)
    except (UsageError, ConfigError) as exc:
        print(f"ddptop: error: {exc}", file=sys.stderr)
        return USAGE_EXIT
    tune_dir = _tune_dir(args.runs_dir)
    fixed = fixed_knobs(args.overrides)
    user_cmd = args.user_cmd
    script = f", script {' '.join(user_cmd)}" if user_cmd else ""
    print(
        f"ddptop tune: {base.nproc} rank(s), {steps_text(base)}, budget "
        f"{args.budget:g}s{', fixed: ' + ', '.join(sorted(fixed)) if fixed else ''}{script}; records in {tune_dir}",
        flush=True,
    )
    started = time.time()
    runner = run_one
    if user_cmd:

        def runner(config: RunConfig, tune_dir: Path) -> tuple[dict[str, Any], str, bool]:
            return run_one(config, tune_dir, user_cmd)

    try:
        result = run_tune(base, tune_dir, args.budget, fixed, runner=runner)
    except KeyboardInterrupt:  # between runs, outside the runs' own signal handling
        result = TuneResult(interrupted=True)
    rows = tune_rows(result.trials)
    extra = [p for p in args.overrides if p.split("=", 1)[0].strip() not in TUNE_KNOBS]
    best = verdict(result.trials, base.nproc, extra, user_cmd)
    notes = list(result.notes)
    if result.interrupted:
        notes.append("interrupted: the search stopped early")
    if result.advice is not None:
        notes.append(f"advisor on the baseline run: {result.advice.reason}")
    notes.append("steps/s are single runs: differences of a few percent are run-to-run noise")
    backend = next(
        (t.summary.get("backend") for t in result.trials if t.summary.get("backend")), None
    )
    model = next((t.summary.get("model") for t in result.trials if t.summary.get("model")), None)
    title = (
        f"ddptop {tune_dir.name}: {base.nproc} rank(s), {steps_text(base)}, {model or base.model}, "
        f"{backend or base.backend}, {len(result.trials)} config(s) in {time.time() - started:.0f}s"
    )
    md = render_markdown(title, rows, best, notes)
    data = {
        "tune_id": tune_dir.name,
        "dir": str(tune_dir),
        "argv": list(argv),
        "budget_s": args.budget,
        "command": user_cmd,
        "fixed": sorted(fixed),
        "started_at": started,
        "ended_at": time.time(),
        "interrupted": result.interrupted,
        "baseline_steps_per_s": baseline_rate(result.trials),
        "advice": result.advice.to_dict() if result.advice is not None else None,
        "trials": rows,
        "best": best["best"],
        "best_lossless": best.get("best_lossless"),
        "notes": notes,
    }
    from ddptop.run.recorder import write_json

    write_json(tune_dir / "tune.json", data)
    (tune_dir / "tune.md").write_text(md)
    print("\n" + md, end="", flush=True)
    print(f"\ntune: {tune_dir / 'tune.md'}, {tune_dir / 'tune.json'}", flush=True)
    if args.json:
        print(json.dumps(data, separators=(",", ":")), flush=True)
    if result.interrupted:
        return 130
    return 0 if best["best"] is not None else 1


if __name__ == "__main__":
    sys.exit(main_tune(sys.argv[1:]))
