"""How each of the script's DDP modules has its gradient communication timed, and NCCL's
own times joined to the step records.

With no comm hook DDP keeps its C++ all-reduce: on a GPU NCCL times it (nccl_timing), else
backward's marks give exposed communication only (on gloo always, unless gloo_timing: any
Python comm hook costs a gloo step ~60 us a bucket, docs/BENCHMARKS.md). Otherwise a
`CommTimer` hook per DDP module times each bucket (around the hook the script or the run
registers). See
ddptop.rank.comm for the timers themselves.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ddptop.rank.comm import CommTimer, NcclTimes
from ddptop.rank.ddp_settings import ScriptDdp
from ddptop.rank.kernel_clock import KernelClock
from ddptop.rank.steps import StepTracker

Guard = Callable[[Callable[..., Any]], Callable[..., Any]]


HOLD_S = 0.5  # a closed step's record waits this long at most for NCCL to report its all-reduces
HOLD_MAX = 1000  # ...and never more records than this (a run of sub-ms steps)
DDP_OWN_HOOK = "allreduce (DDP's own)"  # the comm hook in effect when none is registered


class DdpComm:
    def __init__(self, torch: Any, tracker: StepTracker, enabled: bool, every: int, *,
                 cuda: Callable[[], bool], capturing: Callable[[], bool], guard: Guard,
                 send_facts: Callable[[dict[str, Any]], None], note: Callable[[str], None],
                 script: ScriptDdp | None, gloo_timing: bool = False) -> None:
        self.torch = torch
        self.gloo_timing = gloo_timing  # off the GPU: a Python hook times each bucket (~60 us a bucket)
        self.tracker = tracker
        self.enabled = enabled  # the run's comm_timing
        self.every = self._every = every  # a GPU times one step in `every` (and every step of a capture window)
        self._cuda, self._capturing, self._guard = cuda, capturing, guard
        self.send_facts, self.note, self.script = send_facts, note, script
        self.register: Any = None  # DDP's own register_comm_hook
        self.timers: dict[int, CommTimer] = {}  # id(ddp) -> its timer
        # NCCL's own timing where DDP keeps its C++ all-reduce: id(process group) -> its times
        self.nccl_times: dict[int, NcclTimes] = {}
        self._nccl_timed: dict[int, int] = {}  # id(ddp) -> its gradient bytes per step (0: a hook changes them)
        self._exposed_only: set[int] = set()  # id(ddp): DDP's C++ all-reduce, exposed comm only
        self._untimed: set[int] = set()  # timers that only carry a hook ddptop set (comm_timing off)
        self._closed_at: dict[int, float] = {}  # step -> host time it closed (steady clock)
        self._per_step = 0  # all-reduces of the last step known complete (a later one was reported)
        self._held: list[dict[str, Any]] = []  # records waiting for NCCL to report their all-reduces
        self.clock: KernelClock | None = None  # ddptop's NCCL profiler plugin, where NCCL loaded it
        self._clock_why: str | None = None  # why there is none (None: not looked for yet)
        self._clock_said = False
        self._clock_on = True  # the plugin's state as last set (it starts on)
        self._kernel_steps: set[int] = {0}  # steps whose all-reduces the plugin stamped (on at the start)
        self._plugin_loaded = False
        self._clock_tries = 0

    # --- a new DDP module -----------------------------------------------------------------
    def choose(self, ddp: Any, hook: tuple[Any, Any] | None) -> str | None:
        """Set up the timing of a new DDP module (`hook`: the one the run sets on it); what
        the facts call its comm timing, None when not timed."""
        cuda = self._cuda()
        # NCCL times every all-reduce itself, with or without a comm hook: comm_ms is the
        # collectives' own time (what a trace's NCCL kernels add up to); a hook's whole span
        # (cast, divide, decompress) is hook_ms beside it
        by_nccl = self.enabled and cuda and self._time_by_nccl(ddp, hooked=hook is not None)
        if self.enabled and hook is None and (cuda or not self.gloo_timing):
            # DDP keeps its C++ all-reduce: a Python hook per bucket cost ~3.5% of a ViT-L step
            # on one H100, and ~60 us a bucket on gloo (docs/BENCHMARKS.md); backward's marks
            # give exposed comm every step
            self.tracker.comm_elsewhere = True
            if by_nccl:
                return "NCCL's own timing of each all-reduce (nccl_timing), DDP's C++ all-reduce"
            self._exposed_only.add(id(ddp))
            return ("exposed communication from backward's events, DDP's C++ all-reduce "
                    + ("(nccl_timing=true: all-reduce time too)" if cuda else
                       "(gloo_timing=true: each bucket's all-reduce timed too, ~60 us a bucket)"))
        if not (self.enabled or hook is not None):
            return None
        timer = self.make_timer(ddp)
        if hook is not None:  # the run's hook, through the timer as if the script had registered it
            timer.user = hook
            if not self.enabled:
                self._untimed.add(id(ddp))
        # registered at the first forward, so that a hook the script registers after
        # DDP() is wrapped instead of refused (DDP takes one registration)
        nccl = ", NCCL's own timing of each collective" if by_nccl else ""
        return "per-bucket hook" + ("" if not cuda else f", completions every {self.every} steps") + nccl

    def make_timer(self, ddp: Any) -> CommTimer:
        timer = CommTimer(self.torch.distributed, self.tracker.clock.stamp, self.tracker.add_comm,
                          average_in_nccl=self._cuda(), group=ddp.process_group)
        timer.timed = self.timed(self.tracker.step) and self.enabled
        self.timers[id(ddp)] = timer
        self._exposed_only.discard(id(ddp))
        return timer

    def _time_by_nccl(self, ddp: Any, hooked: bool = False) -> bool:
        """NCCL times this DDP's all-reduces (its group's completion hook, shared by every
        DDP on the group), where the run asked for it (TORCH_NCCL_ENABLE_TIMING). Under a
        comm hook the bytes per step are the hook's buckets (`hooked`)."""
        pg = ddp.process_group
        times = self.nccl_times.get(id(pg)) or NcclTimes.attach(self.torch.distributed, pg)
        if times is None:
            return False
        if self._clock_why is None:
            self.clock, self._clock_why = KernelClock.open()
        times.clock = self.clock
        self.nccl_times[id(pg)] = times
        self._nccl_timed[id(ddp)] = 0 if hooked else sum(
            p.numel() * p.element_size() for p in ddp.module.parameters() if p.requires_grad)
        return True

    def hook_in_effect(self, ddp: Any, hook: tuple[Any, Any] | None) -> dict[str, str]:
        """The comm hook fact of a new DDP where nothing of ddptop's registers one: DDP's own
        all-reduce (a hook the script registers later says so itself)."""
        return {"comm_hook": DDP_OWN_HOOK} if hook is None and id(ddp) not in self.timers else {}

    def register_timer(self, ddp: Any) -> None:
        """At a forward of `ddp`: its timer's hook is registered, once."""
        timer = self.timers.get(id(ddp))
        if timer is None or getattr(ddp, "_ddptop_hooked", False):
            return
        ddp._ddptop_hooked = True
        self.register(ddp, None, timer.hook)
        self.send_facts({"comm_hook": timer.hook_name()})

    # --- the script registers a comm hook ---------------------------------------------------
    def on_register(self, ddp: Any, state: Any, hook: Any, register: Any) -> Any:
        """DDP.register_comm_hook: the script's hook runs inside ddptop's timer, or is
        registered as it is where nothing of ddptop's times this DDP."""
        timer = self.timers.get(id(ddp))
        nccl = id(ddp) in self._nccl_timed
        if nccl:
            self._nccl_timed[id(ddp)] = 0  # its hook decides what travels: the timer's buckets say
        if timer is None and (id(ddp) in self._exposed_only or nccl):  # a Python hook now: time around it
            timer = self._guard(self.make_timer)(ddp)
            self.send_facts({"comm_timing": "per-bucket hook around the script's comm hook"
                             + (", NCCL's own timing of each collective" if nccl else "")})
        if timer is None:  # comm timing off, or not our DDP
            return register(ddp, state, hook)
        if self.script is not None:
            self._guard(self.script.script_hook_wins)(ddp, hook)
        first = timer.user is None and not getattr(ddp, "_ddptop_hooked", False)
        timer.user = (state, hook)
        self.send_facts({"comm_hook": timer.hook_name()})
        if first:
            ddp._ddptop_hooked = True
            return register(ddp, None, timer.hook)
        return None  # ours is registered already: it now runs the script's hook

    def on_builtin(self, ddp: Any, comm_hook_type: Any, builtin: Any) -> Any:
        """DDP._register_builtin_comm_hook: a C++ hook, not timed per bucket."""
        if self.script is not None:
            self._guard(self.script.script_hook_wins)(ddp, comm_hook_type)
        self.timers.pop(id(ddp), None)
        if id(ddp) in self._nccl_timed:
            self._nccl_timed[id(ddp)] = 0
        else:
            self.note("DDP's built-in C++ comm hook is registered: per-bucket communication is not timed")
        self.send_facts({"comm_hook": f"{getattr(comm_hook_type, 'name', comm_hook_type)} (DDP's built-in C++ hook)"})
        return builtin(ddp, comm_hook_type)

    # --- step boundaries -------------------------------------------------------------------
    def timed(self, step: int) -> bool:
        return not self._cuda() or step % self.every == 0 or self._capturing()

    def sampled(self, k: int) -> None:
        """The layer is engaged one step in `k` (ddptop.rank.phase_every): the timed steps are among
        those, about as often as asked (every `k` steps at least)."""
        self.every = k * max(1, round(self._every / k))

    def set_timed(self, step: int) -> None:
        """Whether the timers stamp step `step`'s buckets, and NCCL its kernels (the plugin's
        kernel stamps keep NCCL's proxy thread polling: 1.3% of a Lightning step when on at
        every step, docs/BENCHMARKS.md; so one step in `every`, and every step of a capture)."""
        timed = self.timed(step)
        for key, timer in self.timers.items():
            timer.timed = timed and key not in self._untimed
        if self.clock is not None:
            if timed != self._clock_on:
                self._clock_on = timed
                self.clock.enable(timed)
            if timed:
                self._kernel_steps.add(step)

    def pause(self) -> None:
        """No bucket is stamped, no kernel either, while the instrument is bypassed (cost_ab)."""
        for timer in self.timers.values():
            timer.timed = False
        if self.clock is not None:
            self.clock.enable(False)
            self._clock_on = False

    def resume(self, step: int) -> None:
        """Engaged again at `step`: what NCCL reported meanwhile belongs to no record."""
        now = time.monotonic()
        for times in self.nccl_times.values():
            times.take(now)
        self._closed_at.clear()
        self.set_timed(step)

    def compressing(self) -> dict[str, float]:
        """The compression the timers' hooks reported for the step just closed, for its record."""
        compressing = [c for c in (t.compressing() for t in self.timers.values()) if c is not None]
        return {"compressing": max(compressing)} if compressing else {}

    def step_closed(self, step: int) -> None:
        if self.nccl_times:
            self._closed_at[step] = time.monotonic()

    def with_nccl_times(self, records: list[dict[str, Any]], flush: bool) -> list[dict[str, Any]]:
        """Records whose all-reduces NCCL has reported (one issued after the step closed has
        been: they complete in order), with comm_ms (the kernels' time), buckets and bytes.
        A step is also complete once as many of its all-reduces are reported as the last
        complete step had (the next all-reduce may come late: HF's Trainer gathers its token
        count first, and a capture window's end writes traces for seconds).
        A record waits at most HOLD_S (NCCL's watchdog reports every ~0.1 s: an 8 ms step's
        record that waited 4 steps, as before, mostly went without; on 2x H200 a toy model
        had 35 of 130 steps timed); one still unreported then goes without comm_ms, like a
        step the Python hook does not time."""
        if not self.nccl_times:
            return records
        self._held.extend(records)
        if flush and self._held:
            time.sleep(0.25)  # the end of the run: NCCL's watchdog reports every ~0.1 s
        out = []
        while self._held:
            rec = self._held[0]
            closed = self._closed_at.get(int(rec["step"]))
            times = list(self.nccl_times.values())
            proven = closed is not None and all(t.reported_after(closed) for t in times)
            reported = proven or (closed is not None and 0 < self._per_step <= sum(t.count_until(closed) for t in times))
            late = closed is not None and time.monotonic() - closed > HOLD_S
            if not (reported or flush or late or len(self._held) > HOLD_MAX or closed is None):
                break
            self._held.pop(0)
            self._closed_at.pop(int(rec["step"]), None)
            if closed is not None and (reported or flush):
                taken = self._add_times(rec, times, closed)
                if proven:
                    self._per_step = taken
            elif closed is not None:
                for t in times:
                    t.take(closed)  # too late for this step: its all-reduces are dropped
            out.append(rec)
        if flush and self.clock is not None:
            self._say_missed(self.clock)
        return out

    def _add_times(self, rec: dict[str, Any], times: list[NcclTimes], closed: float) -> int:
        """comm_ms of the all-reduces issued before the step closed; returns how many."""
        step = int(rec["step"])
        kernel = step in self._kernel_steps
        self._kernel_steps.discard(step)
        if len(self._kernel_steps) > 64:  # steps that never closed with a record (bypassed)
            self._kernel_steps = {s for s in self._kernel_steps if s > step}
        durations = [d for t in times for d in t.take(closed, kernel)]
        if durations and not kernel and self._kernel_only():
            return len(durations)  # a step the plugin did not stamp: NCCL's span is not the kernel's
        if durations:
            if "comm_ms" in rec:  # a comm hook's stamped span: hand-over to its future's end
                rec["hook_ms"] = rec["comm_ms"]
            rec["comm_ms"] = sum(durations)  # one stream per group: they do not overlap
            if rec.get("exposed_comm_ms", 0.0) > rec["comm_ms"]:
                # backward's return also waits for DDP's copy back of the gradients: what it
                # could not hide of the all-reduce is at most the all-reduce
                rec["exposed_comm_ms"] = rec["comm_ms"]
            rec.setdefault("buckets", float(len(durations)))
            per_step = list(self._nccl_timed.values())
            if all(per_step):
                rec["comm_bytes"] = float(sum(per_step))
            if not self._clock_said:
                self._say_clock()
        return len(durations)

    def _say_missed(self, clock: KernelClock) -> None:
        """At the run's end: the stamped all-reduces that had no kernel record (their NCCL span
        stood in), where there were any."""
        dropped = clock.dropped()
        if clock.missed or dropped:
            self.send_facts({"comm_clock_missed": (
                f"{clock.missed} of {clock.missed + clock.matched} all-reduces on stamped steps had no "
                f"kernel record (NCCL's span stood in); the plugin dropped {dropped}")})

    def _kernel_only(self) -> bool:
        """comm_ms comes from the plugin alone: NCCL loaded it (asked until it has)."""
        if not self._plugin_loaded and self.clock is not None:
            self._plugin_loaded = self.clock.loaded()
        return self._plugin_loaded

    def _say_clock(self) -> None:
        """Once the first timed step is in: whose clock its comm_ms is (the facts' comm_clock).
        Where NCCL loaded the plugin but its first stamped step had no record yet, said again
        at the next few steps."""
        clock = self.clock
        self._clock_tries += 1
        self._clock_said = clock is None or bool(clock.matched) or self._clock_tries >= 5 or not self._kernel_only()
        if clock is not None and clock.matched:
            how = (f"the kernel's own time of each all-reduce, on one step in {self.every} and every "
                   "step of a capture (ddptop's NCCL profiler plugin: the GPU's clock at the kernel's "
                   "start and end)")
        else:  # no clock: open() said why; a clock NCCL never loaded, or one with no record yet
            why = self._clock_why or ("ddptop's NCCL profiler plugin had no record of its all-reduces"
                                      if self._kernel_only() else "NCCL did not load ddptop's profiler "
                                      "plugin: it needs NCCL >= 2.28 (profiler interface v5)")
            how = (f"NCCL's own timing of each all-reduce, start to end event: the kernel's launch "
                   f"included ({why})")
        self.send_facts({"comm_clock": how})
