"""What `ddptop sweep` and `ddptop tune` share around their runs: the user's command after
`--`, their common arguments, one validated config per preset, and the numbered directory
with its `<name>.json` and `<name>.md`. Must not import torch or textual.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ddptop.hw.devices import default_nproc, visible_gpus
from ddptop.model.config import PRESETS, SCRIPT_PRESETS, RunConfig, apply_overrides, preset_config
from ddptop.model.usage import UsageError

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


def add_run_args(p: argparse.ArgumentParser) -> None:
    """--nproc, --steps and --warmup: the same for every run of the sweep or tune."""
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


def steps_text(config: RunConfig) -> str:
    if config.script:
        return f"{config.script_steps} steps after {config.warmup} warmup"
    return f"{config.steps} steps ({config.warmup} warmup)"


def batch_dir(runs_dir: Path, name: str) -> Path:
    """A new `<runs_dir>/<name>-<timestamp>[-n]/` (two in one second get a number)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = runs_dir / f"{name}-{stamp}"
    n = 1
    while path.exists():
        n += 1
        path = runs_dir / f"{name}-{stamp}-{n}"
    path.mkdir(parents=True, mode=0o700)
    return path


def write_outputs(where: Path, name: str, data: dict[str, Any], md: str, as_json: bool) -> None:
    """`<name>.json` and `<name>.md` in `where`; the Markdown and where they are on stdout,
    and the JSON as the last line with `as_json`."""
    from ddptop.run.recorder import write_json

    write_json(where / f"{name}.json", data)
    (where / f"{name}.md").write_text(md)
    print("\n" + md, end="", flush=True)
    print(f"\n{name}: {where / f'{name}.md'}, {where / f'{name}.json'}", flush=True)
    if as_json:
        print(json.dumps(data, separators=(",", ":")), flush=True)
