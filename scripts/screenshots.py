"""SVG screenshots of every main view of the TUI, from a real run on this machine.

    .venv/bin/python scripts/screenshots.py                # -> screenshots/*-cpu.svg (or -gpu)

Same command on a laptop (gloo, tiny ViT, CPU stats) and on a GPU node (NCCL,
NVML panel filled, NCCL lines in the logs and the wiring view): it runs with
whatever is there. Drives the app as a user would (keys through the pilot),
including a capture window (`c`) and a settings change, so the captures view
shows real traces and the runs view compares two real runs.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ddptop.cli import visible_gpus
from ddptop.model.config import PRESETS, RunConfig, preset_config
from ddptop.tui.app import DdpTopApp
from ddptop.tui.factory import build_app

REPO = Path(__file__).resolve().parent.parent


async def wait_for(pilot, predicate: Callable[[], bool], timeout: float, what: str,  # noqa: ANN001
                   fatal: bool = True) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            if not fatal:
                print(f"  (gave up waiting for {what})")
                return
            raise SystemExit(f"screenshots: timed out waiting for {what}")
        await pilot.pause(0.25)


def stepping(app: DdpTopApp, at_least: int) -> bool:
    session = app.workbench.current
    return session is not None and all(rs.last_step >= at_least for rs in session.state.ranks.values())


async def shoot(app: DdpTopApp, pilot, out: Path, name: str) -> None:  # noqa: ANN001
    app.refresh_views(force_runs=True)
    await pilot.pause(0.3)
    path = app.save_screenshot(f"{name}.svg", str(out))
    print(f"  {path}")


async def main_async(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = args.tag
    config = preset_config(args.preset, RunConfig(nproc=args.nproc, steps=args.steps, warmup=5))
    runs_dir = Path(args.runs_dir or tempfile.mkdtemp(prefix="ddptop-shots-"))
    app = build_app(config, runs_dir)
    width, height = args.size
    async with app.run_test(size=(width, height)) as pilot:
        await wait_for(pilot, lambda: stepping(app, 20), args.timeout, "both ranks stepping")
        await pilot.pause(args.settle)  # some throughput history and hardware samples
        await shoot(app, pilot, out, f"overview-{tag}")
        # A rank opened: its last step as a time bar, history, memory, process, NCCL peers.
        await pilot.press("down", "enter")
        await pilot.pause(1.0)
        await shoot(app, pilot, out, f"rank-detail-{tag}")
        await pilot.press("escape")
        await pilot.press("2")
        await shoot(app, pilot, out, f"gpu-{tag}")
        await pilot.press("4")
        await shoot(app, pilot, out, f"logs-{tag}")
        await pilot.press("slash", *"step", "enter")  # a search: matches highlighted, n/N between them
        await shoot(app, pilot, out, f"logs-search-{tag}")
        await pilot.press("escape")

        # Wiring: the advisor speaks every few seconds; NCCL's report comes with its logs.
        state = app.workbench.current.state
        await pilot.press("5")
        await wait_for(pilot, lambda: state.advice is not None, 30, "the advisor's first word",
                       fatal=False)
        await shoot(app, pilot, out, f"wiring-{tag}")

        # A capture of the next 3 steps on every rank, shown once its traces are summarised.
        await pilot.press("c")
        await wait_for(pilot, lambda: any(c.status in ("done", "failed")
                                          for c in state.captures.values()),
                       args.timeout, "the capture to finish")
        await pilot.press("6")
        await shoot(app, pilot, out, f"captures-{tag}")
        await pilot.press("1")
        await pilot.press("question_mark")
        await shoot(app, pilot, out, f"help-{tag}")
        await pilot.press("escape")

        # Settings: switch to the next preset with the keyboard and apply.
        await pilot.press("s")
        await pilot.pause(0.3)
        names = list(PRESETS)
        target = args.second_preset
        await pilot.press("enter")
        for _ in range(names.index(target) - names.index(args.preset)):
            await pilot.press("down" if names.index(target) > names.index(args.preset) else "up")
        await pilot.press("enter")
        await shoot(app, pilot, out, f"settings-{tag}")
        await pilot.press("ctrl+s")
        await pilot.pause(0.3)
        await pilot.press("y")  # the live run ends: ddptop asks first
        await wait_for(pilot, lambda: len(app.workbench.sessions) == 2 and stepping(app, 20),
                       args.timeout, "the second run stepping")
        await pilot.pause(args.settle / 2)
        await pilot.press("3")
        await shoot(app, pilot, out, f"runs-{tag}")

        # The overview again in the light theme and in a small terminal.
        await pilot.press("1")
        await pilot.press("t")
        await shoot(app, pilot, out, f"overview-light-{tag}")
        await pilot.press("t")
        await pilot.resize_terminal(80, 24)
        await pilot.pause(0.5)
        await shoot(app, pilot, out, f"overview-80x24-{tag}")

        await pilot.press("q")
        await pilot.press("y")
        await wait_for(pilot, lambda: not app.is_running, 60, "ddptop to stop the run and exit")
    print(f"runs recorded in {runs_dir}")


def parse_size(text: str) -> tuple[int, int]:
    w, _, h = text.partition("x")
    return int(w), int(h)


def main() -> int:
    gpus = visible_gpus() or 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(REPO / "screenshots"))
    p.add_argument("--nproc", type=int, default=min(gpus, 8) if gpus >= 2 else 2)
    p.add_argument("--steps", type=int, default=5000, help="long enough to still run while shooting")
    p.add_argument("--preset", default="baseline")
    p.add_argument("--second-preset", default="view", help="the preset the settings screen applies")
    p.add_argument("--size", type=parse_size, default=(120, 40))
    p.add_argument("--tag", default="gpu" if gpus else "cpu", help="file name suffix")
    p.add_argument("--runs-dir", help="default: a fresh temporary directory")
    p.add_argument("--settle", type=float, default=6.0, help="seconds of running before shooting")
    p.add_argument("--timeout", type=float, default=180.0)
    asyncio.run(main_async(p.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
