"""How a run ended: its final status and, for a failure, which rank failed and why (from
torchrun's report, the ranks' error files and stderr), set on the state once torchrun
has exited. Reads files under the run directory; no UI, no torch.
"""

from __future__ import annotations

from ddptop.model.failures import (
    RootCause,
    blame,
    last_exception,
    last_words,
    launcher_killed,
    launcher_usage_error,
)
from ddptop.model.state import RunState
from ddptop.model.status import RankStatus, rank_in_loop
from ddptop.model.text import printable
from ddptop.run.rank_procs import RankProcesses
from ddptop.run.untrusted import read_text

LOG_MAX = 64 << 20  # torchrun.log read for how torchrun ended (its own log: a few KB)


def settle(state: RunState, rc: int, procs: RankProcesses, now: float, *, recorder_error: str, stopped: bool,
           stop_reason: str, user_script: bool) -> None:
    """Finish `state` after torchrun exited with `rc` (-1: it was cancelled), at `now` (the
    session's clock: the run's start plus monotonic time)."""
    if recorder_error:
        state.finish("failed", now, error=recorder_error)
        return
    if stopped or rc == -1:
        state.finish("stopped", now, error=stop_reason)
        return
    heard = [rs for rs in state.ranks.values() if rs.hello is not None]
    if rc == 0 and (user_script or all(rs.status in ("done", "exited") for rs in heard)):
        # torchrun says every rank exited 0: a rank ddptop never heard from did not fail
        state.finish("completed", now, error=_not_monitored(state, user_script))
        return
    _settle_failure(state, rc, procs, now)


def _not_monitored(state: RunState, user_script: bool) -> str:
    """'' when every rank connected, else which did not and why (its own last word on it). A
    script's rank that never imported torch never tried: it is named only if it said so."""
    unheard = []
    why = ""
    for rank, rs in sorted(state.ranks.items()):
        if rs.hello is not None:
            continue
        said = [line for line in state.logs.get(rank, ()) if "ddptop" in line and "connect" in line.lower()]
        if said or not user_script:
            unheard.append(rank)
            why = why or (said[-1].split("] ", 1)[-1].strip()[:200] if said else "")
    if not unheard:
        return ""
    who = f"rank {unheard[0]}" if len(unheard) == 1 else "ranks " + ",".join(map(str, unheard))
    return f"{who} not monitored (could not connect" + (f": {why})" if why else ")")


def _settle_failure(state: RunState, rc: int, procs: RankProcesses, now: float) -> None:
    ranks = state.ranks.values()
    log = read_text(procs.run_dir / "torchrun.log", LOG_MAX) or ""
    errors = procs.error_files()
    gone = launcher_killed(rc, log, errors, (rs.rank for rs in ranks if rs.status == "crashed"))
    if gone:  # torchrun was killed; ddptop's sweep ended the ranks, which had not failed
        state.finish("failed", now, error=gone, ranks_ended="stopped")
        return
    lost = sorted((rs.lost_at, rs.rank) for rs in ranks if rs.lost_at is not None)
    cause = blame(log, lost[0][1] if lost else None, errors)
    failed = cause.rank if cause else None
    usage = launcher_usage_error(log.splitlines()[-50:]) if cause is None and rc > 0 else ""
    if usage:  # the launcher's own parser: its command line, not a rank, failed
        state.finish("failed", now, error=f"torchrun (the launcher) refused its command line: {usage}")
        return
    own = last_exception(log.splitlines()[-200:]) if cause is None and rc > 0 else ""
    if own and "ChildFailedError" not in own:  # that one is the report of a rank's failure
        # torchrun itself failed (a command that does not exist, a bad rendezvous): no rank ran
        state.finish("failed", now, error=f"torchrun exited with code {rc}: {own}")
        return
    if failed is None:
        running = [rs for rs in ranks if rank_in_loop(rs.status) or rs.status == RankStatus.CRASHED]
        failed = running[0].rank if running else None
    tail = procs.stderr_tail(failed) if failed is not None else []
    if failed is not None and tail:
        state.failure_log = [printable(line) for line in tail]  # a rank's bytes, shown as text
    error = _error_text(state, rc, cause, failed, tail)
    rs = state.ranks.get(failed) if failed is not None else None
    if rs is not None and rs.hello is None and rs.lost_at is None:
        # it never reached `import torch` with ddptop's layer, or died before its hello
        error = f"rank {failed} failed before connecting to ddptop: {error}"
    killed = cause is None or cause.exitcode is None or cause.exitcode < 0
    if all(rs.status == "done" for rs in ranks) and killed:
        # Every rank said goodbye after its last step: the training completed, and a
        # process died in teardown (gloo has aborted at interpreter exit, "terminate
        # called without an active exception"). Say both, and keep the run's result.
        rank = f"rank {failed}: " if failed is not None else ""
        state.finish("completed", now, error=f"every rank completed; then at exit {rank}{error}")
        state.add_log(-1, f"[ddptop] run completed, but {rank}{error} after its last step")
        return
    state.finish("failed", now, error=error, failed_rank=failed)


def _error_text(state: RunState, rc: int, cause: RootCause | None, failed: int | None,
                tail: list[str]) -> str:
    rs = state.ranks.get(failed) if failed is not None else None
    raised = last_exception(state.logs.get(rs.rank, ())) if rs is not None and rs.status == "crashed" else ""
    if cause and cause.message:
        # the rank raised, then died of a signal in teardown (gloo aborts at exit): the
        # exception is the cause, the signal what torchrun saw last
        signal_only = cause.message.startswith("Signal ") or (cause.exitcode or 0) < 0
        return f"{raised} (then {cause.message} at exit)" if raised and signal_only else cause.message
    if cause and cause.exitcode is not None:
        # a script without torchrun's @record leaves no error file: its own last words
        # (its exception, or what the interpreter or the shell said on its stderr)
        last = (last_exception(state.logs.get(failed, ())) or last_words(tail)) if failed is not None else ""
        return f"{last} (exit code {cause.exitcode})" if last else f"exit code {cause.exitcode}"
    if rc == 0:
        return "torchrun exited 0 but not every rank reported completion"
    return f"torchrun exited with code {rc}"
