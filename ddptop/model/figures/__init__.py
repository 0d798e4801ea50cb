"""Every figure a view shows, each computed in one function named with its window where it
has one (`_last50`: each rank's last WINDOW records, RECENT_LABEL; `_run`: the whole run
after warmup, RUN_LABEL), and the one rule for each verdict views show (slowest rank, stall
bound). Every view, the summary, the headless lines, the sweep/tune tables and the advisor
call these; tests/layout/test_figures_once.py fails if a figure helper is written anywhere else.

- `stats`: median, percentile, percent, mean, the union of spans, the Histogram;
- `window`: one rank's recent window (RankWindow -> RankFigures);
- `rules`: over ranks' recent windows (slowest, pace now, comm and phase shares, stall bound,
  a node's step and own work);
- `run_window`: whole-run figures of a rank and of the job, and shares read back from a summary.

Pure: no I/O, no UI; depends on the protocol's phase names only. (The straggler verdict,
which needs paired steps and a memory across checks, is ddptop.model.straggler's.)
"""

from ddptop.model.figures.rules import (
    comm_shares_last50,
    comm_window,
    fastest,
    job_samples_per_s_last50,
    job_samples_per_step_last50,
    job_step_ms_p50_last50,
    job_steps_per_s_last50,
    node_own_ms_last50,
    node_step_ms_p50_last50,
    phase_shares_last50,
    rank_samples_per_s_last50,
    slowest,
    stall_bound_s,
    warming_up,
)
from ddptop.model.figures.run_window import (
    RankTotals,
    comm_window_run,
    eval_ms_per_step_run,
    job_samples_per_s_run,
    job_steps_per_s_run,
    job_tokens_per_s_run,
    mean_share_run,
    rank_phases_mean_run,
    rank_samples_per_s_run,
    rank_share_run,
    rank_steps_per_s_run,
    rank_tokens_per_s_run,
    ranks_connected,
    speedup,
    step_ms_pcts_run,
    summary_comm_shares,
    summary_mean_ms,
    timing_switch,
)
from ddptop.model.figures.stats import (
    Histogram,
    Span,
    mean,
    median,
    median_nonempty,
    merge_spans,
    merged_percentiles,
    pct,
    percent,
    percentile,
    span_length,
    union_length,
)
from ddptop.model.figures.window import (
    EMPTY,
    MIN_RECORDS,
    PHASES_WITH_COMM,
    RECENT_LABEL,
    RUN_LABEL,
    STALL_MIN_S,
    STALL_STEPS,
    WINDOW,
    RankFigures,
    RankRecords,
    RankWindow,
    eval_ms_per_step_recent,
    exposed_of_comm,
    host_gap_ms_recent,
    rank_figures,
)

__all__ = [
    "EMPTY", "MIN_RECORDS", "PHASES_WITH_COMM", "RECENT_LABEL", "RUN_LABEL", "STALL_MIN_S", "STALL_STEPS",
    "WINDOW", "Histogram", "RankFigures", "RankRecords", "RankTotals", "RankWindow", "Span",
    "comm_shares_last50", "comm_window", "comm_window_run", "eval_ms_per_step_recent", "eval_ms_per_step_run", "exposed_of_comm", "fastest", "host_gap_ms_recent", "job_samples_per_s_last50", "job_samples_per_s_run",
    "job_samples_per_step_last50", "job_step_ms_p50_last50", "job_steps_per_s_last50",
    "job_steps_per_s_run", "job_tokens_per_s_run", "mean", "mean_share_run", "median", "median_nonempty", "merge_spans",
    "merged_percentiles", "node_own_ms_last50", "node_step_ms_p50_last50", "pct", "percent", "percentile", "phase_shares_last50", "rank_figures",
    "rank_phases_mean_run", "rank_samples_per_s_last50", "rank_samples_per_s_run", "rank_share_run",
    "rank_steps_per_s_run", "rank_tokens_per_s_run", "ranks_connected", "slowest", "span_length", "speedup", "stall_bound_s",
    "step_ms_pcts_run", "summary_comm_shares", "summary_mean_ms", "timing_switch", "union_length", "warming_up",
]
