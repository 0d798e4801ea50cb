"""`ddptop tune`: search DDP settings (comm hook, PowerSGD rank, bucket size, static graph,
bucket view) within a wall-clock budget and report the fastest configuration found.

It runs `baseline` first, asks the advisor (its reading of the baseline run: comm share,
NCCL transports, NVLink) where to start, always runs the advisor's presets (so the result is
never slower than the best of them), then walks best-first: one knob at a time around the
fastest configuration so far. Runs go through ddptop.commands.batch_run, one config at a time.

With `-- CMD` it tunes the user's own script: the first run is the script as it is (`asis`,
its DDP arguments read back from its DDP object are where the search starts), every later run
sets all the tuned knobs on the script's DDP, and no run starts that the budget cannot hold.

The search space and order (ddptop.commands.tune_search) and the ranking, table and command
line (ddptop.commands.tune_report) are pure; only `run_tune` and `main_tune` start anything.
Must not import torch or textual.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ddptop.analysis.advisor import Advice, advise_run, explain
from ddptop.commands.batch import (
    add_batch_args,
    add_run_args,
    batch_dir,
    build_configs,
    check_runnable,
    split_command,
    steps_text,
    write_outputs,
)
from ddptop.commands.batch_run import progress_line, run_one
from ddptop.commands.sweep import with_interval
from ddptop.commands.tune_report import baseline_rate, render_markdown, tune_rows, verdict
from ddptop.commands.tune_search import (
    TUNE_KNOBS,
    Trial,
    Tuner,
    compress_first,
    point_of,
    point_read_back,
    preset_point,
    seed_sources,
)
from ddptop.model.config import ConfigError, RunConfig, parse_value
from ddptop.model.usage import USAGE_EXIT, OneLineParser, UsageError


@dataclass
class TuneResult:
    trials: list[Trial] = field(default_factory=list)
    advice: Advice | None = None
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------- the search loop


class _Search:
    """One tune under way: its trials, its budget, and the runs it starts."""

    def __init__(self, base: RunConfig, tune_dir: Path, budget_s: float, fixed: Iterable[str],
                 out: TextIO, runner: Any, clock: Any) -> None:
        self.base, self.tune_dir, self.budget_s = base, tune_dir, budget_s
        self.out, self.runner, self.clock = out, runner, clock
        self.tuner = Tuner(base, fixed)
        self.result = TuneResult()
        self.started = clock()
        self.strict = base.script  # a script's run time is not ddptop's to know

    def attempt(self, point: Mapping[str, Any], source: str, config: RunConfig | None = None,
                label: str = "") -> Trial | None:
        """Run `point` (or `config` as it is); None when the point was tried already."""
        if config is None:
            if not self.tuner.visit(point):
                return None
            config = self.tuner.config_for(point)
        result = self.result
        trial = Trial(len(result.trials) + 1, point_of(config), source, label=label)
        print(
            f"[{trial.index:>2}] {config.preset:<12} {config.describe():<44} {source:<34} ",
            end="",
            file=self.out,
            flush=True,
        )
        t0 = self.clock()
        try:
            trial.summary, trial.run_dir, interrupted = self.runner(config, self.tune_dir)
        except KeyboardInterrupt:
            trial.summary = {"status": "stopped", "error": "interrupted", "config": config.to_dict()}
            interrupted = True
        trial.wall_s = self.clock() - t0
        result.trials.append(trial)
        result.interrupted = result.interrupted or interrupted
        print(progress_line({**trial.summary, "elapsed_s": trial.wall_s}), file=self.out, flush=True)
        return trial

    def budget_left(self) -> bool:
        """Whether one more run fits: the mean run so far (a script: the longest) would end
        within the budget."""
        walls = [t.wall_s for t in self.result.trials]
        estimate = (max(walls) if self.strict else sum(walls) / len(walls)) if walls else 0.0
        return self.clock() - self.started + estimate <= self.budget_s

    def baseline(self) -> Trial | None:
        """The baseline run; a script's is the script as it is, and its DDP arguments read
        back are the point the search starts from."""
        if not self.base.script:
            return self.attempt(preset_point("baseline"), "baseline")
        trial = self.attempt({}, "baseline", config=self.base, label="asis")
        if trial is not None:
            read = point_read_back(trial.summary)
            if read is not None:
                trial.point = read
                self.tuner.visit(read)
        return trial

    def seeds(self, compress: bool) -> bool:
        """The advisor's presets; False when interrupted."""
        seeds = seed_sources(self.result.advice)
        for name, why in seeds:
            if self.strict and not self.budget_left():
                break
            trial = self.attempt(preset_point(name), why)
            if self.result.interrupted:
                return False
            if trial is not None:
                self.tuner.expand(trial, compress)
        if not self.budget_left():
            ran = len(self.result.trials) - 1
            self.result.notes.append(
                f"the baseline and the advisor's presets took the whole budget ({self.budget_s:g}s): "
                "no search around them; give a larger --budget"
                if ran >= len(seeds)
                else f"the budget ({self.budget_s:g}s) held the baseline and {ran} of the advisor's "
                f"{len(seeds)} presets: no search; give a larger --budget"
            )
        return True

    def search(self, compress: bool) -> None:
        """Best-first around the fastest configurations while the budget lasts."""
        while self.budget_left():
            nxt = self.tuner.next_move()
            if nxt is None:
                self.result.notes.append("search space around the best configurations exhausted")
                break
            move, parent = nxt
            trial = self.attempt(move.point, f"#{parent} + {move.describe()}")
            if self.result.interrupted:
                break
            if trial is not None:
                self.tuner.expand(trial, compress)


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
    search = _Search(base, tune_dir, budget_s, fixed, out or sys.stdout, runner, clock)
    result = search.result
    base_trial = search.baseline()
    if base_trial is None or result.interrupted:
        return result
    if base_trial.rate is None:
        result.notes.append(
            "the baseline run did not complete: nothing to compare against; search skipped"
        )
        return result
    result.advice = advice_for(base_trial.summary)
    compress = compress_first(result.advice)
    search.tuner.expand(base_trial, compress)
    if search.seeds(compress):
        search.search(compress)
    return result


def advice_for(summary: Mapping[str, Any]) -> Advice | None:
    """The advisor's reading of the baseline run: the one its session computed (with the
    NCCL report and NVML topology it had), else `advise_run` on the summary alone."""
    data = summary.get("advice")
    if isinstance(data, Mapping) and "preset" in data:
        return Advice.from_dict(data)
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
    add_run_args(p)
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


def _notes(result: TuneResult, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Under the table: how the search ended, and the advisor's prediction on the baseline
    run set against what the trials measured (so it never contradicts the table)."""
    notes = list(result.notes)
    if result.interrupted:
        notes.append("interrupted: the search stopped early")
    why = explain(result.advice, rows, "tune")
    if why is not None:
        notes.append(f"advisor on the baseline run ({why.label}): {why.reason}")
    notes.append("steps/s are single runs: differences of a few percent are run-to-run noise")
    return notes


def _title(name: str, base: RunConfig, result: TuneResult, started: float) -> str:
    trials = result.trials
    backend = next((t.summary.get("backend") for t in trials if t.summary.get("backend")), None)
    model = next((t.summary.get("model") for t in trials if t.summary.get("model")), None)
    return (
        f"ddptop {name}: {base.nproc} rank(s), {steps_text(base)}, {model or base.model}, "
        f"{backend or base.backend}, {len(trials)} config(s) in {time.time() - started:.0f}s"
    )


def main_tune(argv: Sequence[str]) -> int:
    try:
        args, base = parse_args(argv)
    except (UsageError, ConfigError) as exc:
        print(f"ddptop: error: {exc}", file=sys.stderr)
        return USAGE_EXIT
    tune_dir = batch_dir(args.runs_dir, "tune")
    fixed = fixed_knobs(args.overrides)
    user_cmd = args.user_cmd
    script = f", script {' '.join(user_cmd)}" if user_cmd else ""
    print(
        f"ddptop tune: {base.nproc} rank(s), {steps_text(base)}, budget "
        f"{args.budget:g}s{', fixed: ' + ', '.join(sorted(fixed)) if fixed else ''}{script}; records in {tune_dir}",
        flush=True,
    )
    started = time.time()

    def runner(config: RunConfig, where: Path) -> tuple[dict[str, Any], str, bool]:
        summary, run_dir, interrupted = run_one(config, where, user_cmd)
        return with_interval(summary, run_dir), run_dir, interrupted

    try:
        result = run_tune(base, tune_dir, args.budget, fixed, runner=runner)
    except KeyboardInterrupt:  # between runs, outside the runs' own signal handling
        result = TuneResult(interrupted=True)
    extra = [p for p in args.overrides if p.split("=", 1)[0].strip() not in TUNE_KNOBS]
    best = verdict(result.trials, base.nproc, extra, user_cmd)
    rows = tune_rows(result.trials, (best.get("recommended") or {}).get("trial"))
    notes = _notes(result, rows)
    md = render_markdown(_title(tune_dir.name, base, result, started), rows, best, notes)
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
        "recommended": best.get("recommended"),
        "keep_baseline": best.get("keep", False),
        "best_lossless": best.get("best_lossless"),
        "notes": notes,
    }
    write_outputs(tune_dir, "tune", data, md, args.json)
    if result.interrupted:
        return 130
    return 0 if best["best"] is not None else 1


if __name__ == "__main__":
    sys.exit(main_tune(sys.argv[1:]))
