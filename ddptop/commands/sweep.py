"""`ddptop sweep`: run presets one after another (same seed, same steps; `--repeat N`: N
interleaved rounds), then one table with
speedups, scaling efficiency and the advisor's recommendation, on stdout and in
`<runs-dir>/sweep-<timestamp>/sweep.{json,md}`. With `-- CMD` each preset runs the user's own
script (its DDP gets the preset's knobs, `asis` none), stopped after warmup + --steps steps.
With `--repeat N` each preset runs N times, interleaved in rounds (ddptop.analysis.across_runs
.rounds), and its row gives the median over its runs and an interval across them. Before the
runs, what the advisor expects of each preset is recorded (expected.json); after, it is scored.

The table is built by pure functions over summary dicts (ddptop.commands.sweep_table); the
runs go through ddptop.commands.batch_run; only `main_sweep` starts anything. Must not import
torch or textual.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ddptop.analysis.across_runs import CI_TEXT, ORDER_TEXT, rounds
from ddptop.analysis.advisor import Advice, advise, explain, hw_link_classes, recommend_from_sweep
from ddptop.analysis.sweep_advice import rate_interval
from ddptop.analysis.sweep_expect import (
    Expectation,
    expectations,
    expected_path,
    score,
    score_lines,
)
from ddptop.commands.batch import (
    DEMO_PRESETS,
    add_batch_args,
    add_run_args,
    batch_dir,
    build_configs,
    check_runnable,
    split_command,
    steps_text,
    write_outputs,
)
from ddptop.commands.batch_run import SweepResult, run_sweep
from ddptop.commands.sweep_table import build_rows, fold_runs, reference_preset, render_markdown
from ddptop.model.config import SCRIPT_PRESETS, ConfigError, RunConfig
from ddptop.model.usage import USAGE_EXIT, OneLineParser, UsageError


def sweep_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="ddptop sweep",
        description="Run presets one after another with the same seed and steps (--repeat N: N interleaved "
        "rounds, intervals across runs); print a table with "
        "speedups and a recommendation, and write sweep.json + sweep.md. "
        "`ddptop sweep [OPTIONS] -- python train.py ARGS` sweeps your own script.",
    )
    p.add_argument(
        "--presets",
        help=f"comma-separated (default: {','.join(DEMO_PRESETS)}; for a script: "
        f"{','.join(SCRIPT_PRESETS)})",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="run each preset N times (default 1), interleaved: every preset once in the given "
        "order, then once more in reverse, and so on; each row then gives the median steps/s "
        "over its runs with a 95%% interval across them",
    )
    add_run_args(p)
    add_batch_args(p, "sweep", "e.g. --set workers=0")
    return p


def _env_for_advice(config: RunConfig | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
    if config is not None:
        env.update(config.nccl_env)
    return env


def diagnose(summary: Mapping[str, Any] | None, config: RunConfig | None = None) -> Advice | None:
    """The advisor's reading of one run of the sweep, from the NCCL transports its summary
    holds; None without them (gloo): then the sweep's own numbers say more than the rules."""
    if summary is None or summary.get("status") != "completed":
        return None
    if not (summary.get("nccl") or {}).get("transports"):
        return None
    hw = _hw_links(summary.get("world_size") or 1)
    return advise(summary, hw_links=hw, env=_env_for_advice(config))


def _hw_links(world: int) -> set[str] | None:
    """NVLink or PCIe between the GPUs the ranks used (the first `world` unless
    CUDA_VISIBLE_DEVICES remaps them); None without NVML."""
    from ddptop.hw.gpu import Nvml

    with Nvml() as nvml:
        if not nvml.available:
            return None
        topo = nvml.topology()
    gpus = None if os.environ.get("CUDA_VISIBLE_DEVICES") else range(world)
    return hw_link_classes(topo, gpus)


def step_times(run_dir: str | os.PathLike[str], warmup: int) -> dict[int, list[float]]:
    """Each rank's measured step times (ms) from the run's steps.jsonl, as the summary counts
    them: after warmup, profiled steps left out; empty when the file cannot be read."""
    out: dict[int, list[float]] = {}
    try:
        with open(Path(run_dir) / "steps.jsonl", encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                    if rec["step"] >= warmup and not rec.get("profiled") and rec.get("step_ms") is not None:
                        out.setdefault(int(rec["rank"]), []).append(float(rec["step_ms"]))
                except (ValueError, KeyError, TypeError):
                    continue  # a cut last line, or a record an older ddptop wrote differently
    except OSError:
        return {}
    return out


def with_interval(summary: dict[str, Any], run_dir: str) -> dict[str, Any]:
    """`summary` with `steps_per_s_ci`, the 95% interval of its steps/s from its per-step
    times (None when too few steps or no records)."""
    if summary.get("status") != "completed" or not run_dir:
        return summary
    times = step_times(run_dir, int(summary.get("warmup") or 0))
    return {**summary, "steps_per_s_ci": rate_interval(times)}


def exit_code(result: SweepResult) -> int:
    if result.interrupted:
        return 130
    return 0 if all(s.get("status") == "completed" for s in result.summaries) else 1


def interrupted_note(result: SweepResult, planned: int) -> str:
    """What an interruption left undone: the run it stopped part-way and the runs never started
    (the stopped run is in the summaries, so "not run" alone read 0 when the last run was cut)."""
    stopped = sum(1 for s in result.summaries if s.get("status") == "stopped")
    not_run = planned - len(result.summaries)
    cut = f"{stopped} run(s) stopped part-way, " if stopped else ""
    return f"interrupted: {cut}{not_run} of {planned} run(s) not run"


def sweep_notes(result: SweepResult, rows: Sequence[Mapping[str, Any]], configs: Sequence[RunConfig],
                user_cmd: Sequence[str] | None, repeat: int = 1) -> list[str]:
    """The notes under the table: presets (or runs) not run, what the repeated runs' figures
    are, columns that are n/a and why."""
    notes = []
    if result.interrupted:
        notes.append(interrupted_note(result, len(configs) * repeat))
    if repeat > 1:
        notes.append(f"each preset ran {repeat} times, {ORDER_TEXT}; steps/s and the other figures are each the "
                     f"median over its completed runs; steps/s 95% CI: {CI_TEXT}; speedup 95% CI: the ratio of "
                     "the intervals' ends (above 1 only when they are apart)")
    if not any(r["preset"] == "single" for r in rows) and not user_cmd:
        notes.append("scaling efficiency needs the `single` preset in the sweep")
    if user_cmd:
        notes.append("settings: the DDP arguments in effect, read back from each run's DDP object")
        notes += sorted({re.sub(r"^rank \d+: ", "", n) for s in result.summaries for n in s.get("notes") or []})
    if all(r["comm_share"] is None for r in rows):
        if any(r.get("exposed_comm_ms") is not None for r in rows):  # the default: the wait, not the total
            notes.append("comm share is n/a: the all-reduce total is not timed by default (nccl_timing, or "
                         "gloo_timing on a CPU, times it); exposed comm ms is what backward did not hide")
        else:
            notes.append("comm share and exposed comm are n/a: the runs reported no comm timings")
    return notes


def _title(name: str, result: SweepResult, configs: Sequence[RunConfig]) -> str:
    first = configs[0]
    ranks = max(c.world_size for c in configs)
    backend = next((s.get("backend") for s in result.summaries if s.get("backend")), None)
    model = next((s.get("model") for s in result.summaries if s.get("model")), None)
    return (
        f"ddptop {name}: {ranks} rank(s), {steps_text(first)}, "
        f"{model or first.model}, {backend or first.backend}"
    )


def _parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[RunConfig], list[str] | None]:
    own, user_cmd = split_command(argv)
    args = sweep_parser().parse_args(own)
    if args.repeat < 1:
        raise UsageError(f"--repeat must be at least 1, got {args.repeat}")
    configs = build_configs(args, script=user_cmd is not None)
    check_runnable(configs, args.runs_dir)
    return args, configs, user_cmd


def expect_before(configs: Sequence[RunConfig]) -> dict[str, Any]:
    """What the advisor expects of each preset before any run (ddptop.analysis.sweep_expect),
    from the backend, the ranks, the GPUs' links and the NCCL environment."""
    presets = [c.preset for c in configs]
    ref_name = next((p for p in ("asis", "baseline") if p in presets), next((p for p in presets if p != "single"), None))
    ref = next((c for c in configs if c.preset == ref_name), None)
    if ref is None:
        return {"path": None, "basis": "no DDP preset in the sweep", "presets": [], "recorded_at": time.time()}
    hw = _hw_links(ref.world_size) if ref.backend != "gloo" and ref.world_size > 1 else None
    env = _env_for_advice(ref)
    path = expected_path(ref.backend, ref.world_size, hw, env)
    expected, basis = expectations(presets, ref.to_dict(), ref.world_size, path, hw, env)
    return {"path": path, "basis": basis, "presets": [e.to_dict() for e in expected], "recorded_at": time.time()}


def record_expected(configs: Sequence[RunConfig], sweep_dir: Path) -> dict[str, Any]:
    """`expect_before`, written to `sweep_dir/expected.json` and said on stdout before any run."""
    from ddptop.run.recorder import write_json

    expected = expect_before(configs)
    write_json(sweep_dir / "expected.json", expected)
    if expected["presets"]:
        print("expected before the runs: " + "; ".join(
            f"{e['preset']} {'faster' if e['faster'] else 'not faster'}" for e in expected["presets"]), flush=True)
    return expected


def fold(result: SweepResult, summaries: list[dict[str, Any]], schedule: Sequence[tuple[int, int]],
         configs: Sequence[RunConfig]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The table's rows (one per preset over its runs) and each run in the order it ran."""
    ran = list(zip(schedule, summaries, result.run_dirs))
    runs = [{"round": r, "preset": configs[i].preset, "status": s.get("status"), "steps_per_s": s.get("steps_per_s"),
             "steps_per_s_ci": s.get("steps_per_s_ci"), "run_id": s.get("run_id"), "run_dir": d}
            for (r, i), s, d in ran]
    order = [i for i in range(len(configs)) if any(j == i for (_, j), _, _ in ran)]
    rows = fold_runs([[s for (_, j), s, _ in ran if j == i] for i in order])
    for row, i in zip(rows, order):
        row["run_dirs"] = [d for (_, j), _, d in ran if j == i]
        row["run_dir"] = row["run_dirs"][0]
    return rows, runs


def main_sweep(argv: list[str]) -> int:
    try:
        args, configs, user_cmd = _parse(argv)
    except (UsageError, ConfigError) as exc:
        print(f"ddptop: error: {exc}", file=sys.stderr)
        return USAGE_EXIT
    sweep_dir = batch_dir(args.runs_dir, "sweep")
    first = configs[0]
    ranks = max(c.world_size for c in configs)
    what = f"script {' '.join(user_cmd)}" if user_cmd else f"seed {first.seed}"
    repeat = args.repeat
    times = f" x {repeat} runs ({ORDER_TEXT})" if repeat > 1 else ""
    print(
        f"ddptop sweep: {len(configs)} preset(s){times}, {ranks} rank(s), {steps_text(first)}, {what}; "
        f"records in {sweep_dir}",
        flush=True,
    )
    expected = record_expected(configs, sweep_dir)  # before any run; scored after
    started = time.time()
    schedule = rounds(len(configs), repeat)
    run_configs = [configs[i] for _, i in schedule]
    result = run_sweep(run_configs, sweep_dir, user_cmd=user_cmd)

    summaries = [with_interval(s, d) for s, d in zip(result.summaries, result.run_dirs)]
    rows, runs = fold(result, summaries, schedule, configs) if repeat > 1 else (build_rows(summaries), [])
    for row, d in zip(rows, result.run_dirs if repeat == 1 else []):
        row["run_dir"] = d
    advice = recommend_from_sweep(rows)
    ref = reference_preset(rows)
    ref_run = next((i for i, s in enumerate(summaries) if run_configs[i].preset == ref
                    and s.get("status") == "completed"), None)
    diagnosis = None
    if ref_run is not None:  # the rules' prediction, set against what the table measured
        diagnosis = explain(diagnose(summaries[ref_run], run_configs[ref_run]), rows)
    notes = sweep_notes(result, rows, configs, user_cmd, repeat)
    scored = score([Expectation(**e) for e in expected["presets"]], rows)
    md = render_markdown(rows, advice, _title(sweep_dir.name, result, configs), diagnosis, notes,
                         score_lines(scored))
    judged = [x for x in scored if x["held"] is not None]
    data = {
        "sweep_id": sweep_dir.name,
        "dir": str(sweep_dir),
        "argv": list(argv),
        "started_at": started,
        "ended_at": time.time(),
        "interrupted": result.interrupted,
        "presets": [c.preset for c in configs],
        "repeat": repeat,
        "order": ORDER_TEXT if repeat > 1 else "one run per preset, in the given order",
        "command": user_cmd,
        "reference": ref,
        "rows": rows,
        "runs": runs,
        "advice": advice.to_dict(),
        "diagnosis": diagnosis.to_dict() if diagnosis is not None else None,
        "expected": {**expected, "scored": scored, "held": sum(x["held"] for x in judged), "judged": len(judged)},
    }
    write_outputs(sweep_dir, "sweep", data, md, args.json)
    return exit_code(result)


if __name__ == "__main__":
    sys.exit(main_sweep(sys.argv[1:]))
