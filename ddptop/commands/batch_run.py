"""The one run loop of `ddptop sweep` and `ddptop tune`: configs run to their end one after
the other, each in its own event loop, with a progress line each. A signal stops the current
run (a second one cancels it) and skips the rest. Must not import torch or textual.
"""

from __future__ import annotations

import asyncio
import io
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ddptop.analysis.advisor import comm_shares
from ddptop.commands.sweep_table import share_text
from ddptop.model.config import RunConfig
from ddptop.model.report import fmt
from ddptop.run.signals import STOP_SIGNALS, on_signals

if TYPE_CHECKING:
    from ddptop.run.session import Session



@dataclass
class SweepResult:
    summaries: list[dict[str, Any]] = field(default_factory=list)
    run_dirs: list[str] = field(default_factory=list)
    interrupted: bool = False


def progress_line(summary: Mapping[str, Any]) -> str:
    share, exposed = comm_shares(summary)
    bits = [f"{summary.get('status')}"]
    if summary.get("steps_per_s") is not None:
        bits += [
            f"{summary['steps_per_s']:.2f} steps/s",
            f"p50 {fmt(summary.get('step_ms_p50'), '.1f')} ms",
            # without a timed total (the default), the wait backward did not hide, not `comm n/a`
            f"comm {share_text(share)}" if share is not None or exposed is None else f"exposed comm {share_text(exposed)}",
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
    out = out or sys.stdout
    result = SweepResult()
    for i, config in enumerate(configs, 1):
        print(
            f"[{i}/{len(configs)}] {config.preset:<12} {config.describe():<40} ",
            end="",
            file=out,
            flush=True,
        )
        session, error = _run_config(config, sweep_dir, user_cmd, result)
        summary = _summary(config, session, error, result.interrupted)
        result.summaries.append(summary)
        result.run_dirs.append(str(session.run_dir) if session is not None else "")
        print(progress_line(summary), file=out, flush=True)
        if result.interrupted:
            break
    return result


def run_one(
    config: RunConfig, where: Path, user_cmd: Sequence[str] | None = None
) -> tuple[dict[str, Any], str, bool]:
    """One run through the same loop, no progress line: (summary, run dir, interrupted)."""
    result = run_sweep([config], where, out=io.StringIO(), user_cmd=user_cmd)
    return result.summaries[0], result.run_dirs[0], result.interrupted


def _run_config(
    config: RunConfig, sweep_dir: Path, user_cmd: Sequence[str] | None, result: SweepResult
) -> tuple[Session | None, str]:
    """One config's session, run in its own event loop, and what went wrong ("" if
    nothing); a signal marks `result` interrupted."""
    from ddptop.run.session import Session

    box: list[Session] = []

    async def one() -> None:
        session = Session(config, sweep_dir, user_cmd=list(user_cmd) if user_cmd else None)
        box.append(session)
        task = asyncio.current_task()

        def on_signal(name: str) -> None:
            if result.interrupted and task is not None:
                task.cancel()  # second signal: stop now
            result.interrupted = True
            session.request_stop(f"sweep interrupted ({name})")

        with on_signals(dict.fromkeys(STOP_SIGNALS, on_signal)):
            await session.run()

    error = ""
    try:
        asyncio.run(one())
    except (asyncio.CancelledError, KeyboardInterrupt):
        # a second signal, or Ctrl-C in the instant before the handlers are in place
        result.interrupted = True
        error = "interrupted"
    except Exception as exc:  # a run that cannot start must not hide the others' results
        error = f"{type(exc).__name__}: {exc}"
    return (box[0] if box else None), error


def _summary(config: RunConfig, session: Session | None, error: str, interrupted: bool) -> dict[str, Any]:
    """The run's summary; one that failed to start or was cut short says so."""
    summary = (
        session.state.summary()
        if session is not None
        else {"preset": config.preset, "config": config.to_dict()}
    )
    if error and summary.get("status") not in ("failed", "stopped"):
        summary = {**summary, "status": "failed" if not interrupted else "stopped"}
    if error and not summary.get("error"):
        summary["error"] = error
    return summary
