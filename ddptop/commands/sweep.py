"""`ddptop sweep`: run presets back to back (same seed, same steps), then one table with
speedups, scaling efficiency and the advisor's recommendation, on stdout and in
`<runs-dir>/sweep-<timestamp>/sweep.{json,md}`. With `-- CMD` each preset runs the user's own
script (its DDP gets the preset's knobs, `asis` none), stopped after warmup + --steps steps.

The table is built by pure functions over summary dicts (`build_rows`, `markdown_table`);
only `run_sweep` and `main_sweep` start anything. Must not import torch or textual.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ddptop.analysis.advisor import (
    Advice,
    advise,
    comm_shares,
    hw_link_classes,
    mean_ms,
    recommend_from_sweep,
)
from ddptop.hw.devices import default_nproc, visible_gpus
from ddptop.model.config import (
    PRESETS,
    SCRIPT_PRESETS,
    ConfigError,
    RunConfig,
    apply_overrides,
    preset_config,
)
from ddptop.model.report import fmt
from ddptop.model.usage import USAGE_EXIT, OneLineParser, UsageError

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# A user's script runs SCRIPT_PRESETS by default; `asis` (its own DDP arguments) is the reference.
DEMO_PRESETS = tuple(p for p in PRESETS if p != "asis")
SCRIPT_STEPS = 50  # a script's default steps after warmup, per run


def split_command(argv: Sequence[str]) -> tuple[list[str], list[str] | None]:
    """(ddptop's own arguments, the user's command after `--` or None)."""
    argv = list(argv)
    if "--" not in argv:
        return argv, None
    cut = argv.index("--")
    if not argv[cut + 1 :]:
        raise UsageError("nothing to run after --")
    return argv[:cut], argv[cut + 1 :]


def sweep_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="ddptop sweep",
        description="Run presets back to back with the same seed and steps; print a table with "
        "speedups and a recommendation, and write sweep.json + sweep.md. "
        "`ddptop sweep [OPTIONS] -- python train.py ARGS` sweeps your own script.",
    )
    p.add_argument(
        "--presets",
        help=f"comma-separated (default: {','.join(DEMO_PRESETS)}; for a script: "
        f"{','.join(SCRIPT_PRESETS)})",
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
    add_batch_args(p, "sweep", "e.g. --set workers=0")
    return p


def add_batch_args(p: argparse.ArgumentParser, name: str, set_note: str) -> None:
    """--set, --runs-dir and --json, as `ddptop sweep` and `ddptop tune` both take them."""
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a RunConfig field in every run (repeatable); {set_note}",
    )
    p.add_argument(
        "--runs-dir",
        type=Path,
        default=Path("ddptop-runs"),
        help=f"the {name} goes in RUNS_DIR/{name}-<timestamp>/",
    )
    p.add_argument("--json", action="store_true", help=f"also print {name}.json as the last line")


def parse_presets(text: str | None, script: bool = False) -> list[str]:
    if text is None:
        return list(SCRIPT_PRESETS if script else DEMO_PRESETS)
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError("--presets is empty")
    unknown = [n for n in names if n not in PRESETS]
    if unknown:
        raise UsageError(f"unknown preset(s) {', '.join(unknown)} (valid: {', '.join(PRESETS)})")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UsageError(f"preset(s) listed twice: {', '.join(dupes)}")
    return names


def build_configs(args: argparse.Namespace, script: bool = False) -> list[RunConfig]:
    """One validated config per preset; raises UsageError/ConfigError before anything runs.
    `script`: the runs are a user's command (steps count after warmup)."""
    names = parse_presets(args.presets, script)
    nproc = args.nproc
    if nproc is None:

        nproc = default_nproc()
    base = RunConfig(nproc=nproc, script=script)
    changes: dict[str, Any] = {"steps": args.steps, "warmup": args.warmup}
    if script:
        if args.steps is not None and args.steps < 1:
            raise UsageError(f"--steps must be at least 1, got {args.steps}")
        changes = {"script_steps": args.steps or SCRIPT_STEPS, "warmup": args.warmup}
    elif args.warmup is None and args.steps is not None:
        # short runs keep most of their steps measured unless told otherwise (as `ddptop`)
        changes["warmup"] = min(base.warmup, max(args.steps, 0) // 4)
    base = base.with_changes(**{k: v for k, v in changes.items() if v is not None})
    return [apply_overrides(preset_config(name, base), args.overrides) for name in names]


def check_runnable(configs: Sequence[RunConfig], runs_dir: Path) -> None:
    from ddptop.run.recorder import check_writable

    problem = check_writable(runs_dir)
    if problem:
        raise UsageError(problem)
    gpus = None
    for config in configs:
        if config.backend == "gloo" or not config.ddp:
            continue
        gpus = visible_gpus() if gpus is None else gpus
        if gpus and config.nproc > gpus:
            raise UsageError(
                f"--nproc {config.nproc} is more than the {gpus} visible GPU(s); "
                "use fewer ranks or --set backend=gloo"
            )


# ---------------------------------------------------------------------------- the table (pure)


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


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def build_rows(summaries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per run summary (summary.json dicts), with speedup vs `baseline` (else vs the
    first row with a throughput) and scaling efficiency vs `single` when it is in the sweep:
    steps/s of the row over steps/s of single, as each rank processes its own batch."""
    rows: list[dict[str, Any]] = []
    for s in summaries:
        share, exposed = comm_shares(s)
        rows.append({
            "preset": s.get("preset"),
            "settings": _settings(s),
            "world_size": s.get("world_size"),
            "status": s.get("status"),
            "error": s.get("error") or "",
            "steps_per_s": s.get("steps_per_s"),
            "samples_per_s": s.get("samples_per_s"),
            "tokens_per_s": s.get("tokens_per_s"),
            "step_ms_p50": s.get("step_ms_p50"),
            "comm_ms": mean_ms(s, "comm_ms"),
            "comm_share": share,
            "exposed_comm_ms": mean_ms(s, "exposed_comm_ms"),
            "exposed_comm_share": exposed,
            "run_id": s.get("run_id"),
        })  # fmt: skip
        if s.get("command"):  # what the script asked for and what ddptop changed, read back
            info = rank_info(s)
            rows[-1].update(ddp_asked=info.get("ddp_asked"), ddp_set=info.get("ddp_set"),
                            in_effect={k: info.get(k) for k in IN_EFFECT})
    ref = reference_preset(rows)
    ref_rate = next((r["steps_per_s"] for r in rows if r["preset"] == ref), None)
    single = next(
        (r["steps_per_s"] for r in rows if r["preset"] == "single" and r["steps_per_s"]), None
    )
    for r in rows:
        r["speedup"] = _ratio(r["steps_per_s"], ref_rate)
        r["efficiency"] = _ratio(r["steps_per_s"], single)
    return rows


IN_EFFECT = ("static_graph", "gradient_as_bucket_view", "bucket_cap_mb", "comm_hook", "autocast")


def reference_preset(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """What speedups are measured against: the script as it is (asis) or baseline if it ran,
    else the first row that did."""
    measured = [r for r in rows if r.get("steps_per_s")]
    base = next((r for r in measured if r["preset"] == "asis"), None)
    base = base or next((r for r in measured if r["preset"] == "baseline"), None)
    ref = base or (measured[0] if measured else None)
    return ref["preset"] if ref else None


def ratio_text(value: float | None) -> str:
    return fmt(value, ".2f") + ("x" if value is not None else "")


def share_text(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.0f}%"


def table_cells(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Headers and formatted cells; the efficiency column only when `single` is in the sweep."""
    ref = reference_preset(rows)
    has_single = any(r["preset"] == "single" for r in rows)
    has_tokens = any(r.get("tokens_per_s") for r in rows)
    headers = [
        "preset",
        "settings",
        "ranks",
        "status",
        "steps/s",
        "samples/s",
        *(["tokens/s"] if has_tokens else []),
        "step p50 ms",
        "comm share",
        "exposed comm ms",
        f"speedup vs {ref or 'baseline'}",
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
            fmt(r["steps_per_s"], ".2f"),
            fmt(r["samples_per_s"], ".1f"),
            *([fmt(r.get("tokens_per_s"), ".0f")] if has_tokens else []),
            fmt(r["step_ms_p50"], ".1f"),
            share_text(r["comm_share"]),
            fmt(r["exposed_comm_ms"], ".1f"),
            ratio_text(r["speedup"]),
        ]
        if has_single:
            row.append(share_text(r["efficiency"]))
        cells.append(row)
    return headers, cells


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A GitHub Markdown table, padded so it also reads as plain text; numbers right-aligned."""
    headers, cells = table_cells(rows)
    widths = [max(len(x) for x in [h, *(c[i] for c in cells)]) for i, h in enumerate(headers)]
    numeric = [i >= 4 or h == "ranks" for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        padded = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return "| " + " | ".join(padded) + " |"

    rule = ["-" * (w - 1) + ":" if num else "-" * w for w, num in zip(widths, numeric)]
    return "\n".join([line(headers), line(rule), *(line(c) for c in cells)])


def render_markdown(
    rows: Sequence[Mapping[str, Any]],
    advice: Advice,
    title: str,
    diagnosis: Advice | None = None,
    notes: Sequence[str] = (),
) -> str:
    """The whole sweep.md: title, table, notes, recommendation (and the advisor's reading of
    the reference run when it has one)."""
    parts = [f"## {title}", "", markdown_table(rows), ""]
    failed = [r for r in rows if r["status"] not in ("completed",) and r["error"]]
    parts += [f"- {r['preset']}: {r['status']}: {r['error']}" for r in failed]
    parts += [f"- {n}" for n in notes]
    if failed or notes:
        parts.append("")
    parts.append(f"**Recommendation:** {advice.reason}")
    if diagnosis is not None and diagnosis.reason:
        parts += ["", f"**Why (advisor, on the {reference_preset(rows)} run):** {diagnosis.reason}"]
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------------------- running


@dataclass
class SweepResult:
    summaries: list[dict[str, Any]] = field(default_factory=list)
    run_dirs: list[str] = field(default_factory=list)
    interrupted: bool = False


def progress_line(summary: Mapping[str, Any]) -> str:
    share, _ = comm_shares(summary)
    bits = [f"{summary.get('status')}"]
    if summary.get("steps_per_s") is not None:
        bits += [
            f"{summary['steps_per_s']:.2f} steps/s",
            f"p50 {fmt(summary.get('step_ms_p50'), '.1f')} ms",
            f"comm {share_text(share)}",
        ]
    if summary.get("error"):
        bits.append(f"({summary['error']})")
    bits.append(f"{summary.get('elapsed_s') or 0:.1f}s")
    return "  ".join(bits)


def run_sweep(
    configs: Sequence[RunConfig],
    sweep_dir: Path,
    out: TextIO | None = None,
    user_cmd: Sequence[str] | None = None,
) -> SweepResult:
    """Run each config to its end, one after the other, each in its own event loop. A signal
    stops the current run (and a second one cancels it) and skips the rest. `user_cmd`: the
    runs are the user's own script."""
    from ddptop.run.session import Session

    out = out or sys.stdout

    result = SweepResult()
    for i, config in enumerate(configs, 1):
        print(
            f"[{i}/{len(configs)}] {config.preset:<12} {config.describe():<40} ",
            end="",
            file=out,
            flush=True,
        )
        session_box: list[Session] = []

        async def one(config: RunConfig = config, box: list[Session] = session_box) -> None:
            session = Session(config, sweep_dir, user_cmd=list(user_cmd) if user_cmd else None)
            box.append(session)
            loop = asyncio.get_running_loop()
            task = asyncio.current_task()

            def on_signal(name: str) -> None:
                if result.interrupted and task is not None:
                    task.cancel()  # second signal: stop now
                result.interrupted = True
                session.request_stop(f"sweep interrupted ({name})")

            for sig in SIGNALS:
                loop.add_signal_handler(sig, on_signal, signal.Signals(sig).name)
            try:
                await session.run()
            finally:
                for sig in SIGNALS:
                    loop.remove_signal_handler(sig)

        error = ""
        try:
            asyncio.run(one())
        except (asyncio.CancelledError, KeyboardInterrupt):
            # a second signal, or Ctrl-C in the instant before the handlers are in place
            result.interrupted = True
            error = "interrupted"
        except Exception as exc:  # a run that cannot start must not hide the others' results
            error = f"{type(exc).__name__}: {exc}"
        session = session_box[0] if session_box else None
        summary = (
            session.state.summary()
            if session is not None
            else {"preset": config.preset, "config": config.to_dict()}
        )
        if error and summary.get("status") not in ("failed", "stopped"):
            summary = {**summary, "status": "failed" if not result.interrupted else "stopped"}
        if error and not summary.get("error"):
            summary["error"] = error
        result.summaries.append(summary)
        result.run_dirs.append(str(session.run_dir) if session is not None else "")
        print(progress_line(summary), file=out, flush=True)
        if result.interrupted:
            break
    return result


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


def exit_code(result: SweepResult) -> int:
    if result.interrupted:
        return 130
    return 0 if all(s.get("status") == "completed" for s in result.summaries) else 1


def main_sweep(argv: list[str]) -> int:
    try:
        own, user_cmd = split_command(argv)
        args = sweep_parser().parse_args(own)
        configs = build_configs(args, script=user_cmd is not None)
        check_runnable(configs, args.runs_dir)
    except (UsageError, ConfigError) as exc:
        print(f"ddptop: error: {exc}", file=sys.stderr)
        return USAGE_EXIT
    stamp = time.strftime("%Y%m%d-%H%M%S")
    sweep_dir = args.runs_dir / f"sweep-{stamp}"
    n = 1
    while sweep_dir.exists():  # two sweeps in one second
        n += 1
        sweep_dir = args.runs_dir / f"sweep-{stamp}-{n}"
    sweep_dir.mkdir(parents=True, mode=0o700)
    first = configs[0]
    ranks = max(c.world_size for c in configs)
    steps = steps_text(first)
    what = f"script {' '.join(user_cmd)}" if user_cmd else f"seed {first.seed}"
    print(
        f"ddptop sweep: {len(configs)} preset(s), {ranks} rank(s), {steps}, {what}; records in {sweep_dir}",
        flush=True,
    )
    started = time.time()
    result = run_sweep(configs, sweep_dir, user_cmd=user_cmd)

    rows = build_rows(result.summaries)
    advice = recommend_from_sweep(rows)
    ref = reference_preset(rows)
    ref_index = next((i for i, r in enumerate(rows) if r["preset"] == ref), None)
    diagnosis = None
    if ref_index is not None:
        diagnosis = diagnose(result.summaries[ref_index], configs[ref_index])
    notes = []
    if result.interrupted:
        notes.append(f"interrupted: {len(configs) - len(rows)} preset(s) not run")
    if not any(r["preset"] == "single" for r in rows) and not user_cmd:
        notes.append("scaling efficiency needs the `single` preset in the sweep")
    if user_cmd:
        notes.append("settings: the DDP arguments in effect, read back from each run's DDP object")
        notes += sorted({re.sub(r"^rank \d+: ", "", n) for s in result.summaries for n in s.get("notes") or []})
    if all(r["comm_share"] is None for r in rows):
        notes.append("comm share and exposed comm are n/a: the runs reported no comm timings")
    backend = next((s.get("backend") for s in result.summaries if s.get("backend")), None)
    model = next((s.get("model") for s in result.summaries if s.get("model")), None)
    title = (
        f"ddptop {sweep_dir.name}: {ranks} rank(s), {steps}, "
        f"{model or first.model}, {backend or first.backend}"
    )
    md = render_markdown(rows, advice, title, diagnosis, notes)
    data = {
        "sweep_id": sweep_dir.name,
        "dir": str(sweep_dir),
        "argv": list(argv),
        "started_at": started,
        "ended_at": time.time(),
        "interrupted": result.interrupted,
        "presets": [c.preset for c in configs],
        "command": user_cmd,
        "reference": ref,
        "rows": [{**r, "run_dir": d} for r, d in zip(rows, result.run_dirs)],
        "advice": advice.to_dict(),
        "diagnosis": diagnosis.to_dict() if diagnosis is not None else None,
    }
    from ddptop.run.recorder import write_json

    write_json(sweep_dir / "sweep.json", data)
    (sweep_dir / "sweep.md").write_text(md)
    print("\n" + md, end="", flush=True)
    print(f"\nsweep: {sweep_dir / 'sweep.md'}, {sweep_dir / 'sweep.json'}", flush=True)
    if args.json:
        print(json.dumps(data, separators=(",", ":")), flush=True)
    return exit_code(result)


def steps_text(config: RunConfig) -> str:
    if config.script:
        return f"{config.script_steps} steps after {config.warmup} warmup"
    return f"{config.steps} steps ({config.warmup} warmup)"


if __name__ == "__main__":
    sys.exit(main_sweep(sys.argv[1:]))
