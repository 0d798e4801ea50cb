"""The straggler rule. A rank is named a straggler only when it costs the job time beyond the
run's own step-to-step noise, by enough to matter, keeps doing so, and the host's CPU does not
account for it:

- a check pairs the ranks' records step by step over the last WINDOW measured steps (warmup
  and profiled steps left out).
- who: where every rank's all-reduce time (comm_ms) is measured on MIN_STEPS of the window,
  the rank the others wait for: per step, the others' median comm_ms minus its own (a
  collective ends together on every rank, so the last to reach it spends the least time in
  it). Else (no all-reduce timed on most steps: a GPU run's default) from what every step
  has: per step, its own work beyond the next-latest rank's (below), above 0 on the steps it
  was the last. The rank with the largest median of these differences is the one looked at
  (a Finding).
- beyond noise: a one-sided sign test on those per-step differences, Bonferroni-corrected
  over the ranks compared, p <= ALPHA (no distribution assumed; a few slow steps cannot win
  it, a rank that is late on most steps does); its cost's 95% interval, not only the cost, at
  least MIN_MS (below): a rank last on most steps of a busy host can cost the job nothing told
  apart from noise.
- its cost to the job: how much shorter the step would be if it ran as fast as the others.
  Per step, its own work (step less its exposed wait) beyond the next-latest rank's: were it
  as fast as the others, the latest of them would set the step (measured against the others'
  median, a 4-GPU run with a second late rank read 23.0 ms for a 10.2 ms loss), at most its
  typical excess over the others' median (as fast as the others, it keeps its own noise; a
  symmetric rank's excess is ~0), 0 on a step it was not the last; averaged over the steps;
  plus the others' wait for it inside their backward (their backward, less its exposed wait,
  longer than its own: the all-reduce of a bucket cannot end before it hands the bucket over),
  which lengthens their own work too (a GPU-bound GPT on 4x H200, session 13: 6.7 ms for a
  6.64 ms loss; the margin alone read 3.2). Not in a launch-bound job (some rank's GPU waits
  for its host at its steps' start: straggler_work.launch_bound), whose backward is paced by
  its hosts (session 9: counting the wait read 8.2 ms for a 5.9 ms loss, the margin 6.4).
  Where the others' wait hides it so fully that its own work is not the latest beyond chance
  (the sign test), the work outside backward (data, forward, optimizer) is compared instead.
  A launch-bound job whose hosts all run ahead while they wait for it shows no late host: its
  cost is then an upper bound (session 13: 6.3 ms for a 1.7 ms loss; straggler_work.Costs).
  The evidence: its phase's excess, the others' wait for it at backward's end (exposed) and
  inside backward (hidden). Cost at least MIN_MS and MIN_SHARE of the step (the others' median
  step, which waits for it).
- which phase: the one of its own work with the largest median excess over the others'. The
  forward phase runs on to backward's start, so where the rank's host spent at least half of
  that excess between the forward's return and backward (host_gap_ms: nanoGPT fetches the next
  batch there), the phase is straggler_work.AFTER_FORWARD, not the model's forward. Where its
  data phase is longer than the others' too, its host is late (`forward, its host late`:
  straggler_work.host_late; on a GPU its GPU idled at each step's start, waiting for it).
- sensitivity: the smallest cost the sign test would see at the noise of these steps (the
  spread of the per-step costs), or the floors: what "no straggler" says it could have seen.
- a busy host is not a straggler: with ddptop.model.host_load's reading of the host over
  the window's seconds, an excess the rank's own wait for a core (beyond the others') accounts
  for, or a hypervisor stealing the CPU, names no rank: "host CPU contended: N runnable on M
  cores"; a busy host is said beside "no straggler" too (the rule then sees less).
- persistent: a check runs every EVERY measured steps; the verdict (a rank, or none)
  changes only when PERSIST checks in a row agree on the new one (Verdict.after). The run's
  verdict (the summary's) is the one in force on most checks, not the last.

Pure: no I/O, no UI. RunState (ddptop.model.state) keeps the Verdict and runs the checks
as records arrive; views read its words through Snapshot.verdict_text (one function).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Protocol

from ddptop.model.figures.stats import mean, median_nonempty
from ddptop.model.host_load import Contention
from ddptop.model.paired import MIN_STEPS, Paired, median_ci, sign_p, smallest_last, smallest_seen
from ddptop.model.straggler_work import Costs, late, own_work, phase_of, phase_words

HostOver = Callable[[float], Contention | None]  # seconds -> the host's CPU over the last that many
WINDOW = 50  # measured steps a check pairs up (the last ones up to the step checked)
EVERY = 10  # a check after every EVERY measured steps (the step every rank has finished)
PERSIST = 3  # K: the verdict changes only when this many checks in a row agree
ALPHA = 0.001  # the sign test's level, one-sided, after the Bonferroni correction
MIN_MS = 2.0  # a straggler's median cost to the job per step: at least this...
MIN_SHARE = 0.03  # ...and at least this share of the step
CATCH_UP = 2 * PERSIST  # checks run at most for a batch of records that crosses many boundaries


class RankRecords(Protocol):
    """What a check reads of a rank (ddptop.model.rank_state.RankState)."""

    last_step: int
    recent: collections.deque[dict[str, float]]  # its latest records, oldest first


@dataclass(frozen=True)
class Finding:
    """One check: the rank the others wait for, what it costs the job, and the evidence."""

    rank: int
    step: int  # the last step of the window checked
    n: int  # paired steps in the window
    ranks: int  # ranks compared
    own_ms: float  # its median own work per step
    others_ms: float  # median over the steps of the others' median own work
    step_ms: float  # median over the steps of the others' median step (they wait for it)
    excess_ms: float  # median over the steps of (its own work - the others' median)
    ci_low_ms: float  # 95% confidence interval of the cost's median (order statistics, no model)
    ci_high_ms: float
    p: float  # one-sided sign test that it is slower on most steps, x the ranks compared
    phase: str  # where its excess goes: the phase with the largest median paired excess
    basis: str = "own work"  # "waits": who from comm_ms; else own work
    last: int = 0  # the steps on which it came last (waits: it spent the least time in all-reduce)
    cost_ms: float = 0.0  # what it costs the job a step (see the module's docstring)
    phase_ms: float = 0.0  # its median excess in `phase` over the others' median
    exposed_ms: float = 0.0  # the others' median wait for it at backward's end, beyond its own
    hidden_ms: float = 0.0  # the others' wait for it inside their backward (0: none seen)
    launch_bound: bool = False  # a rank's GPU waited for its host: the hidden wait is not in the cost
    host_late_ms: float = 0.0  # its data phase beyond the others' where its host is late (straggler_work.host_late)
    sees_ms: float = 0.0  # the smallest cost this check could have named at this noise
    contended: str = ""  # the host's CPU accounts for the excess ("host CPU contended: ...")
    host: str = ""  # the host was busy over these steps, named or not ("host CPU contended: ...")

    @property
    def share(self) -> float:
        """Its cost as a share of the step: what every step of the job loses to it."""
        return self.cost_ms / self.step_ms if self.step_ms > 0 else 0.0

    @property
    def beyond_noise(self) -> bool:
        return self.p <= ALPHA

    @property
    def large(self) -> bool:
        return self.cost_ms >= MIN_MS and self.share >= MIN_SHARE

    @property
    def slow(self) -> bool:
        """Beyond noise and large, its cost's 95% interval too (at least MIN_MS): a straggler,
        unless the host's CPU accounts for it. (On a busy 2-core host a rank last on most steps
        read `costs the job 2.8 ms/step (95% CI -0.3-9.3)` and `2.2 ms/step (95% CI 0.6-4.4)`:
        named, though its cost was not told apart from none, or from under the floor.)"""
        return self.beyond_noise and self.large and self.ci_low_ms >= MIN_MS

    @property
    def named(self) -> bool:
        """This check alone would name it (the Verdict also wants PERSIST in a row)."""
        return self.slow and not self.contended

    def describe(self) -> str:
        """A named straggler: rank, phase, the cost with its interval, the evidence."""
        last = f"last on {self.last}/{self.n} steps"  # fewer: the ranks take turns being last
        late = f", data {self.host_late_ms:+.1f} ms" if self.host_late_ms else ""
        return (f"rank {self.rank} straggler: {phase_words(self.phase, self.host_late_ms)}, costs the job "
                f"{self.cost_ms:.1f} ms/step ({100 * self.share:.0f}%, 95% CI {self.ci_low_ms:.1f}-{self.ci_high_ms:.1f}; "
                f"its {self.phase} {self.phase_ms:+.1f} ms{late}, others wait {self.exposed_ms:.1f} ms "
                f"+{self.hidden_ms:.1f} hidden{self._uncounted()}; {last})")

    def _uncounted(self) -> str:
        """Why the others' wait inside backward is not in the cost, where it is not."""
        return " (not counted: launch-bound)" if self.launch_bound and self.hidden_ms > 0 else ""

    def largest(self) -> str:
        """The largest cost found, and the smallest the rule could have seen here; its interval
        where that, not the cost, kept it unnamed (else `+2.8 ms ... sees >= 2.0` reads as a
        rank that should have been named)."""
        short = self.beyond_noise and self.large and not self.slow
        ci = f" (95% CI {self.ci_low_ms:.1f}-{self.ci_high_ms:.1f})" if short else ""
        return (f"largest: rank {self.rank} {self.cost_ms:+.1f} ms, {100 * self.share:.0f}%{ci}; "
                f"the rule sees >= {self.sees_ms:.1f} ms here")

    def calm(self) -> str:
        """This check, when it names no one."""
        if self.contended:
            return f"{self.contended} (rank {self.rank} {self.phase} {self.cost_ms:+.1f} ms/step, not named)"
        return f"no straggler ({self.largest()})" + (f"; {self.host}" if self.host else "")


NONE, HOST = "none", "host"  # the verdict in force, besides a rank: none, or the host's CPU


@dataclass(frozen=True)
class Verdict:
    """The straggler verdict across checks (RunState.straggler_verdict): it changes only
    when PERSIST checks in a row agree on another one. `held` counts, over the run's checks,
    what each found (a rank named, "rank N", HOST or NONE); `kept` has the finding behind each
    (a rank's latest; HOST's and NONE's largest cost): the run's verdict."""

    checked: int = -1  # the last step a check ended on
    rank: int | None = None  # the straggler named; None: there is none
    basis: Finding | None = None  # the latest check that named it (what the verdict rests on)
    latest: Finding | None = None  # the latest check's finding, named or not
    pending: int | None = None  # the verdict the last `streak` checks agree on (None: no straggler)
    streak: int = 0  # 0: nothing pending
    held: dict[str, int] = field(default_factory=dict)
    kept: dict[str, Finding] = field(default_factory=dict)

    @property
    def straggler(self) -> Finding | None:
        return self.basis if self.rank is not None else None

    def after(self, finding: Finding) -> Verdict:
        said = finding.rank if finding.named else None
        if said == self.rank:
            basis = finding if said is not None else None
            out = replace(self, checked=finding.step, basis=basis, latest=finding, pending=None, streak=0)
        elif (streak := self.streak + 1 if self.streak and self.pending == said else 1) >= PERSIST:
            out = replace(self, checked=finding.step, rank=said, basis=finding if said is not None else None,
                          latest=finding, pending=None, streak=0)
        else:
            out = replace(self, checked=finding.step, latest=finding, pending=said, streak=streak)
        return out._tally(finding)

    def _tally(self, finding: Finding) -> Verdict:
        """The run's count goes by what each check found, not by the verdict in force (which
        waits PERSIST checks before it names a rank: a 50-step run named its delayed rank on
        1 of 3 checks and read "no straggler" at the end)."""
        key = f"rank {finding.rank}" if finding.named else (HOST if finding.slow and finding.contended else NONE)
        held = {**self.held, key: self.held.get(key, 0) + 1}
        kept = dict(self.kept)
        for k in {key, NONE}:  # NONE's: the largest cost of any check, named or not ("largest: ...")
            old = kept.get(k)
            if (k == key and finding.named) or old is None or finding.cost_ms > old.cost_ms:
                kept[k] = finding
        return replace(self, held=held, kept=kept)

    def in_force(self) -> str:
        if self.rank is not None:
            return f"rank {self.rank}"
        latest = self.latest
        return HOST if latest is not None and latest.slow and latest.contended else NONE

    def describe(self) -> str:
        """The verdict in force in one line, the actionable part first; empty before the first check."""
        latest = self.latest
        if self.basis is not None and self.rank is not None:
            return self.basis.describe()
        if latest is None:
            return ""
        if self.streak and self.pending is not None:
            checks = f"{self.streak} check" + ("s" if self.streak > 1 else "")
            return (f"no straggler yet: rank {latest.rank} {latest.phase} costs {latest.cost_ms:.1f} ms/step "
                    f"({100 * latest.share:.0f}%) in the last {checks}; {PERSIST} in a row name one")
        return latest.calm()

    def run_describe(self) -> str:
        """The run's verdict: the one in force on most of its checks, with how many."""
        total = sum(self.held.values())
        if not total:
            return self.describe()
        key = self._most_held()
        finding = self.kept.get(key)
        if finding is None:
            return self.describe()
        text = finding.describe() if key.startswith("rank ") else finding.calm()
        if key not in self.held:  # only ranks found, each on fewer checks than name one
            return f"{text}; {total} check{'s' if total > 1 else ''}, fewer than the {PERSIST} that name a rank"
        return f"{text}; {self.held[key]} of {total} checks"

    def _most_held(self) -> str:
        """The verdict in force on most checks; on a tie, a rank's (it was named for as long). A
        rank found on fewer than PERSIST checks is not the run's straggler: the verdict in force
        never named it either (a 30-step demo's one check named a rank its live view never did)."""
        held = {k: n for k, n in self.held.items() if not k.startswith("rank ") or n >= PERSIST}
        return max(sorted(held), key=lambda k: (held[k], k.startswith("rank "))) if held else NONE

    def run_straggler(self) -> Finding | None:
        """The straggler of the run's verdict (None: the run's verdict names no rank)."""
        total = sum(self.held.values())
        if not total:
            return self.straggler
        key = self._most_held()
        return self.kept.get(key) if key.startswith("rank ") else None


def words(verdict: Verdict, finished: bool) -> str:
    """The one wording every view shows: the verdict in force while the run goes, the run's
    verdict once it ended."""
    return verdict.run_describe() if finished else verdict.describe()

def next_check(checked: int, warmup: int) -> int:
    """The step the next check ends on, after `checked`: every EVERY measured steps once
    MIN_STEPS are in."""
    first = max(warmup, 0) + MIN_STEPS - 1
    start = max(checked + 1, first)
    return start + (-(start - first)) % EVERY


def check_steps(checked: int, common: int, warmup: int) -> list[int]:
    """The steps a check ends on, after `checked` up to `common` (the step every rank has
    finished); the last CATCH_UP of them."""
    return list(range(next_check(checked, warmup), common + 1, EVERY))[-CATCH_UP:]


def advance(verdict: Verdict, ranks: Mapping[int, RankRecords], warmup: int, host: HostOver | None = None) -> Verdict:
    """Run the checks that are due now that these ranks have reported more steps. `host`:
    the host's CPU over the last so many seconds, where the monitor reads it."""
    if len(ranks) < 2:
        return verdict
    common = min(rs.last_step for rs in ranks.values())
    for end in check_steps(verdict.checked, common, warmup):
        finding = check(ranks, end, warmup, host)
        verdict = verdict.after(finding) if finding is not None else replace(verdict, checked=end)
    return verdict


def _window(rs: RankRecords, end: int, warmup: int) -> dict[int, dict[str, float]]:
    """step -> record, for the rank's measured records of the WINDOW steps up to `end`."""
    low = max(end - WINDOW, warmup - 1)
    out = {}
    for rec in reversed(rs.recent):  # newest first: stop at the window's start
        step = int(rec["step"])
        if step <= low:
            break
        if step <= end and "step_ms" in rec and not rec.get("profiled"):
            out[step] = rec
    return out


def as_stored(found: Finding) -> Finding:
    """Its figures in ms as summary.json stores them (3 decimals), so that its words and every
    reader of the file format one number: 80.4499 read `80.4` in the verdict and `80.5` from
    the file's 80.45 (the advisor, a test; session 11)."""
    return replace(found, **{f.name: round(getattr(found, f.name), 3) for f in fields(found)
                             if f.name.endswith("_ms") and isinstance(getattr(found, f.name), float)})


def check(ranks: Mapping[int, RankRecords], end: int, warmup: int, host: HostOver | None = None) -> Finding | None:
    """One check over the WINDOW steps up to `end`; None with fewer than MIN_STEPS paired.
    `host`: the host's CPU over the last so many seconds (these steps'), where it is read."""
    windows = {r: _window(rs, end, warmup) for r, rs in ranks.items()}
    waits = Paired(windows, late)
    medians = waits.medians()
    costs = Costs(windows, ALPHA)
    timed = len(medians) == len(windows)
    # who: from the all-reduce waits where every rank's are timed on enough steps, else from
    # what every step has (the cost itself: own work, and the others' wait inside backward)
    who = waits.diffs if timed else {r: costs.of(r)[0] for r in windows}
    if not timed:
        medians = {r: median_nonempty(sorted(d.values())) for r, d in who.items() if len(d) >= MIN_STEPS}
    if not medians:
        return None
    worst = max(sorted(medians), key=lambda r: medians[r])
    steps = sorted(who[worst])
    cost, excess, hidden, added = costs.of(worst)
    d = sorted(cost[s] for s in steps if s in cost)
    if not d:
        return None
    signs = [who[worst][s] for s in steps]
    step_ms = median_nonempty(sorted(
        median_nonempty(sorted(w[s]["step_ms"] for r, w in windows.items() if r != worst and s in w)) for s in steps))
    # the step it would save as fast as the others (its typical excess off, its noise kept):
    # per step its margin over the next-latest rank, in [0, that excess]; averaged; plus the
    # others' wait for it inside their backward, where their own work holds it (`added`)
    extra = sorted(excess[s] for s in steps if s in excess)
    typical = median_nonempty(extra)
    gains = [min(max(x, 0.0), max(typical, 0.0)) for x in d]
    saved = (mean(gains) or 0.0) + added
    low, high = (v + saved - typical for v in median_ci(extra))  # the typical excess's interval, moved
    phase, phase_ms, host_late_ms = phase_of(worst, windows, steps)
    sees = max(MIN_MS, MIN_SHARE * step_ms,
               smallest_last(d, typical, len(medians), ALPHA) if not timed else smallest_seen(d, len(medians), ALPHA))
    own, exposed = costs.own, costs.exposed.diffs[worst]
    found = Finding(
        rank=worst, step=end, n=len(steps), ranks=len(medians),
        own_ms=median_nonempty(sorted(own_work(windows[worst][s]) for s in steps)),
        others_ms=median_nonempty(sorted(own.others[worst][s] for s in steps if s in own.others[worst])),
        step_ms=step_ms, excess_ms=median_nonempty(sorted(own.diffs[worst][s] for s in steps if s in own.diffs[worst])),
        ci_low_ms=low, ci_high_ms=high,
        p=min(1.0, sign_p(sum(x > 0 for x in signs), sum(x != 0 for x in signs)) * len(medians)),
        phase=phase, basis="waits" if timed else "own work", last=sum(x > 0 for x in signs),
        cost_ms=saved, phase_ms=phase_ms, hidden_ms=hidden, launch_bound=costs.launch_bound, host_late_ms=host_late_ms,
        exposed_ms=median_nonempty(sorted(exposed[s] for s in steps if s in exposed)) if exposed else 0.0,
        sees_ms=sees if math.isfinite(sees) else 0.0,
    )
    found = as_stored(found)
    contention = host(found.n * step_ms / 1000.0) if host is not None else None
    if contention is not None:
        found = replace(found, contended=contention.explains(worst, found.cost_ms, step_ms) if found.slow else "",
                        host=contention.words() if contention.busy else "")
    return found
