"""The rank-side instrument: measures any training script through torch's own hooks.

Attached once torch is imported (ddptop.rank.attach); from then on:
- optimizer steps (torch.optim's global step hooks, GradScaler.step) end steps;
- forwards: hooks on every DDP module (its __init__ wrapped), or, without DDP, the first step's top modules;
- backward: a hook on the forward's output marks its start; autograd callbacks mark the
  end of its compute and, chained after DDP's own, its return (all-reduces done);
- communication: a CommTimer or NCCL's own timing on each DDP module (ddptop.rank.ddp_comm);
- the run's DDP knobs go into the script's DDP() and comm hook (ddptop.rank.ddp_settings);
- stop and capture commands act at step boundaries (optimizer hook); cost_ab, phase_every bypass the rest.
This module wires those together. Nothing here may raise into the user's code except the agreed
stop (what Ctrl-C would raise, ddptop.rank.stop)."""

from __future__ import annotations

import atexit
import functools
import os
from typing import Any

from ddptop.rank import patches, stop
from ddptop.rank.capture import CaptureRunner
from ddptop.rank.client import Probe
from ddptop.rank.clock import AtMostEvery, CudaClock, HostClock, LazyClock
from ddptop.rank.cost_ab import CostAB
from ddptop.rank.ddp_comm import DdpComm
from ddptop.rank.ddp_settings import ScriptDdp, ScriptSettings, blame_settings
from ddptop.rank.facts import ddp_facts, ddp_timing, facts_without_ddp, model_facts
from ddptop.rank.forward_hooks import BackwardMarks, ModuleHooks, OutermostHooks, loss_like
from ddptop.rank.memory import MemorySampler, memory_sample
from ddptop.rank.phase_every import PhaseEvery
from ddptop.rank.replicate import NOT_FOUND, model_name, replicated_module
from ddptop.rank.said import RATES_DIFFER, Said
from ddptop.rank.samples import SampleCount
from ddptop.rank.steps import StepTracker
from ddptop.rank.values import HostCopy, read_values
from ddptop.wire import protocol

SPANS_EVERY_S = 0.5  # bucket spans go to the hub at most this often: the live timeline's rate
# closed steps are read (stamps' times, the record built) in batches at most this often (the probe sends every 0.2 s)
READ_EVERY_S, READ_MAX = 0.1, 64


class Instrument:
    def __init__(self, torch: Any, probe: Probe, rank: int, settings: dict[str, Any]) -> None:
        self.torch, self.probe, self.rank = torch, probe, rank
        self.comm_timing = bool(settings.get("comm_timing", True))
        self.clock: Any = None
        self._lazy = LazyClock(self._current_clock)
        self.tracker = StepTracker(self._lazy)
        self.captures: CaptureRunner | None = None
        self.ddps: list[Any] = []
        self._ddp_timing: dict[str, float] | None = None  # DDP's own logger, for the goodbye
        self.replicas: dict[int, Any] = {}  # id of a module replicate() or torch.compile wraps -> its DDP
        self._stopping = False
        self._from_script: BaseException | None = None  # raised by the script's SIGINT handler at the stop
        self.api_used = False  # the script calls Probe.tick()/record() itself
        self.said = Said(probe, rank)
        self.send_facts, self.note = self.said.send_facts, self.said.note
        self.samples = SampleCount(torch, self.note, self.send_facts)
        self.script = ScriptSettings.of(settings)  # None: ddptop's trainer applies its own settings
        self.script_ddp = ScriptDdp(torch, self.script, self.note, self.send_facts) if self.script else None
        self.step_limit = self.script.last_step if self.script is not None else None
        self.exit_status: Any = None  # what the script passed to sys.exit()
        self._limit_reached = self.crashed = self._left = False  # _left: it destroyed the process group at the limit
        self._spans_due, self._read_due = AtMostEvery(SPANS_EVERY_S), AtMostEvery(READ_EVERY_S)
        self.cost = CostAB(torch, rank, settings, self._engage)  # --set cost_ab=S: engaged vs bypassed
        self.memory = MemorySampler()
        self.comm = DdpComm(
            torch, self.tracker, self.comm_timing, max(1, int(settings.get("comm_timing_every", 10))),
            cuda=self._cuda, capturing=self._capturing, guard=self._guard, send_facts=self.send_facts,
            note=self.note, script=self.script_ddp, gloo_timing=bool(settings.get("gloo_timing", False)))
        self.phases = PhaseEvery(settings, self._sampled)  # engaged one step in K (after the first 50: auto)
        self.outermost = OutermostHooks(torch, self._guard, self._fwd_pre, self._fwd_post)
        self.backward = BackwardMarks(torch, self.tracker, self._guard, self.samples.backward)
        self.hooked = ModuleHooks(self._guard(self._fwd_pre), self._guard(self._fwd_post))
        self.engaged = True
        self.off = False  # a forked child's copy (forked()): every hook does nothing
        self.cost.profile_parts({"tracker.mark": self.tracker, "tracker.ready": self.tracker, "probe.record_step": probe,
                                 "comm.with_nccl_times": self.comm, "cost.step_ended": self.cost,
                                 "samples.forward": self.samples, "backward.watch": self.backward,
                                 "_captures_after": self, "_report": self, "_after_close": self})

    def forked(self) -> None:
        """In a forked child: torch's hooks stay but do nothing; the parent's socket and steps are forgotten."""
        self.off = self.samples.off = True
        self.engaged = False
        self.probe.forget()

    # --- installation -------------------------------------------------------------------
    def install(self) -> None:
        torch = self.torch
        from torch.optim import optimizer
        optimizer.register_optimizer_step_pre_hook(self._guard(self._opt_pre_safe))
        optimizer.register_optimizer_step_post_hook(stop.armed_after(self._guard(self._opt_post_safe)))
        patches.wrap_grad_scaler(torch, self._guard(self._opt_pre_safe), self._guard(self._opt_post_safe))
        patches.wrap_compile(torch, self._guard(lambda compiled: self.hooked.follow(compiled, self.replicas)))
        patches.wrap_spawn(torch, self.note)
        register = patches.wrap_ddp(torch.nn.parallel.DistributedDataParallel, self._ddp_args,
                                    self._guard(self._on_ddp), self.comm.on_register, self.comm.on_builtin)
        if register is not None:
            self.comm.register = register
        patches.wrap_destroy(torch.distributed, self._guard(self.flush), lambda: self._left,
                             self._guard(self._let_go))
        self.outermost.install()
        self._call(self.samples.install)
        self.send_facts({"torch": str(torch.__version__)})
        patches.chain_excepthook(self._on_crash)
        patches.watch_exit(functools.partial(setattr, self, "exit_status"))  # sys.exit(2) is not a completed rank
        atexit.register(self._at_exit)
        patches.wrap_os_exit(self._guard(self._os_exit))

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """`fn(...)`, never raising into the user's code (but the agreed stop): an error is a note, once."""
        if self.off:
            return None
        try:
            return fn(*args, **kwargs)
        except SystemExit:
            raise
        except Exception as exc:  # noqa: BLE001
            if exc is self._from_script:
                raise
            self.note(f"ddptop instrument error in {getattr(fn, '__name__', 'a hook')}: {type(exc).__name__}: {exc}")
            return None

    def _guard(self, fn: Any) -> Any:
        """`fn` as a hook that never raises into the user's code: `_call` bound to it (a partial:
        no frame of its own on each of a step's hook calls)."""
        guarded = functools.update_wrapper(functools.partial(self._call, fn), fn)
        return self.cost.timed(guarded) if self.cost.enabled else guarded

    # --- the clock ------------------------------------------------------------------------
    def _current_clock(self) -> Any:
        if self.clock is None:
            self.clock = HostClock()
        return self.clock

    def _cuda(self) -> bool:
        return isinstance(self.clock, CudaClock)

    def _capturing(self) -> bool:
        return self.captures is not None and self.captures.active is not None

    def _choose_clock(self, module: Any) -> None:
        if self.clock is not None:
            return
        param = next(module.parameters(), None)
        self.clock = CudaClock(self.torch, param.device) if param is not None and param.device.type == "cuda" else HostClock()
        self.cost.use_clock(self.clock, isinstance(self.clock, CudaClock))
        self._lazy.chosen(self.clock)
        self.captures = CaptureRunner(self.torch, self.probe, self.rank, isinstance(self.clock, CudaClock))

    # --- DDP ----------------------------------------------------------------------------
    def _ddp_args(self, init: Any, ddp: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return None if self.script_ddp is None else self._call(self.script_ddp.ddp_kwargs, init, ddp, args, kwargs)

    def _on_ddp(self, ddp: Any) -> None:
        replicate, module = replicated_module(self.torch, ddp)  # composable replicate(): time its module
        if replicate and module is None:
            return self.note(NOT_FOUND)
        self.outermost.drop()
        self.ddps.append(ddp)
        if module is not None:
            self.replicas[id(module)] = ddp
        self._choose_clock(module or ddp.module)
        self.hooked.add(module or ddp)
        self.samples.watch_layout(module or ddp)
        facts = model_facts(self.torch, module or ddp.module)
        if module is not None:
            facts["model"] = model_name(module)
        facts.update(ddp_facts(self.torch.distributed, ddp))
        hook = self.script_ddp.settle(ddp) if self.script_ddp is not None else None
        timing = self.comm.choose(ddp, hook)
        facts.update(self.comm.hook_in_effect(ddp, hook))
        if timing is not None or not self.comm_timing:
            facts["comm_timing"] = timing if self.comm_timing else "off"
        self.send_facts(facts)
        if self.script_ddp is not None:
            self.script_ddp.send_ddp_facts(ddp)

    # --- forward / backward --------------------------------------------------------------
    def _fwd_pre(self, module: Any, args: Any, kwargs: Any = None) -> None:
        if self.clock is None:
            self._choose_clock(module)
        ddp = self.replicas.get(id(module), module)
        if self.comm.timers:
            self.comm.register_timer(ddp)
        if self.script_ddp is not None and self.ddps and ddp is self.ddps[-1]:
            self.script_ddp.first_forward(self._cuda())
        grad, tracker = self.torch.is_grad_enabled(), self.tracker
        if grad:
            self.said.forward_before_any_step(module, tracker.seen_opt or self.api_used)
        samples = self.samples.forward(module, args, kwargs, tracker.step, tracker.in_optimizer) if grad else 0.0
        tracker.mark("fwd" if grad else "eval", samples)

    def _fwd_post(self, module: Any, args: Any, *rest: Any) -> None:  # noqa: ARG002
        output = rest[-1] if rest else None
        if self.samples.output(output):  # the forward's count was taken back
            self.tracker.drop_samples()
        if not self.torch.is_grad_enabled():
            self.tracker.mark("eval_end")
            return
        self.backward.watch(loss_like(self.torch, output), getattr(module, "require_backward_grad_sync", True))

    # --- optimizer steps = step boundaries -----------------------------------------------
    def _opt_pre_safe(self, optimizer: Any, *_: Any) -> None:  # torch.optim's hook, GradScaler.step
        if not self.engaged:
            self.cost.bypassed_opt(begin=True)
            return
        self._step_event(self.tracker.opt_begin, optimizer)

    def _opt_post_safe(self, optimizer: Any, *_: Any) -> None:
        if not self.engaged:  # cost_ab's bypassed blocks: only steps are counted
            if self.cost.bypassed_opt(begin=False, cycle=len(self.tracker.cycle)):
                self.tracker.step += 1
                self._boundary(self.tracker.step - 1)
            return
        self._step_event(self.tracker.opt_end, optimizer)

    def _step_event(self, event: Any, optimizer: Any) -> None:
        closed = event(id(optimizer))  # the callers are guarded: an error here is a note, never raised
        if closed is not None:
            self._closed(closed)

    def _closed(self, step: int) -> None:
        """Step `step` ended: report, stop if agreed, open/close capture windows."""
        self.comm.step_closed(step)
        self._call(self._after_close, step)
        self._boundary(step)

    def _engage(self, on: bool) -> None:
        """At a step boundary (cost_ab, phase_every): bypassed, no forward hook, no stamp; engaged, afresh."""
        if on == self.engaged:
            return
        self.engaged = on
        if on:
            self.hooked.attach()
            self.tracker.resume()
            self.comm.resume(self.tracker.step)
        else:
            self.hooked.detach()
            self.comm.pause()

    def _sampled(self, k: int) -> None:  # phase_every's K, new
        self.comm.sampled(k)
        self.send_facts({"phase_every": k})

    def _sample(self, step: int) -> None:
        """phase_every: engage or bypass the next step; a timed one carries the job's pace since the last."""
        self._engage(self.phases.engaged_after(step, self.captures, self.probe.commands))
        if self.engaged:
            self.tracker.extra.update(self.phases.pace())

    def _boundary(self, step: int) -> None:
        """After every step, engaged or not: cost blocks, the agreed stop, the step limit."""
        if self.cost.enabled:
            self._call(self.cost.step_ended, step)
        elif self.phases.on:
            self._call(self._sample, step)
        limit = self.cost.last_step
        if limit is not None and (self.step_limit is None or limit < self.step_limit):
            self.step_limit = limit
        at, is_limit = stop.agreed_step(self.probe.stop_at, self.step_limit)
        if at is None or step < at or self._stopping:
            return
        self._limit_reached = is_limit
        if self.api_used:  # the script's own tick() stops it (should_stop): a SIGINT now is this stop
            self._call(stop.absorb_next_sigint)
            return
        self._stopping = True
        if not self._limit_reached:  # the user's stop: as Ctrl-C, nothing added to the output
            try:
                stop.ctrl_c()
            except BaseException as exc:
                self._from_script = exc  # the script's own handler raised: it goes to the script
                raise
            return
        self._left = bool(self._call(stop.leave_together, self.torch))
        stop.limit_reached(self.rank, step, "the cost measurement's blocks are done" if at == self.cost.last_step
                           else f"the run's {self.script.steps if self.script else ''} steps after warmup are done")

    def _after_close(self, step: int) -> None:
        tracker = self.tracker
        closed = {} if tracker.last_closed is None else tracker.last_closed
        closed.update(self.comm.compressing())
        if step == 0 and not self.ddps:
            self._first_step_without_ddp()
        if self.memory.due(step):
            closed.update(memory_sample(self.torch, self._cuda()))
        if self._read_due.ready() or len(tracker.pending) >= READ_MAX:
            self._report(tracker.ready(keep_last=self.api_used))
        self._captures_after(step)
        self.comm.set_timed(step + 1)

    def _captures_after(self, step: int) -> None:
        """Close a capture window that ended with `step`, open one that starts next."""
        caps = self.captures
        if caps is None:
            return
        after = caps.end_step(step)
        if after:
            self.tracker.restart()
        caps.poll(step + 1)
        caps.begin_step(step + 1)
        if caps.active is not None or caps.warming is not None or after:
            # a window's steps, and the one after it (a peer may still write its trace), are not typical
            self.tracker.extra["profiled"] = 1

    def _first_step_without_ddp(self) -> None:
        """No DDP module: time the first step's outermost modules, drop the global hooks (costly)."""
        self.outermost.drop()
        tops = self.outermost.take_tops()
        for module in tops:
            self.hooked.add(module)
        facts, note = facts_without_ddp(self.torch, tops)
        if note is not None:
            self.note(note)
        self.send_facts(facts)

    def _report(self, records: list[dict[str, Any]], flush: bool = False) -> None:
        if self.tracker.rates_differ:
            self.note(RATES_DIFFER)
        records = self.comm.with_nccl_times(records, flush)
        for rec in records:
            read_values(rec, wait=flush)
            spans = rec.pop("comm_spans", None)  # a few times a second (the live timeline's rate)
            self.probe.record_step(int(rec.pop("step")), rec, spans if spans is None or self._spans_due.ready() else None)

    # --- the script's own probe calls ----------------------------------------------------
    def user_values(self, values: dict[str, Any]) -> bool:
        """Values from Probe.tick()/record() join the newest closed step (False: no optimizer step seen yet)."""
        self.api_used = True
        tracker = self.tracker
        if not self.engaged:
            return True  # cost_ab's bypassed blocks: the script's values are not kept
        if not tracker.seen_opt:
            return False
        target = tracker.last_closed
        if target is None and tracker.step == 0:
            target = tracker.extra  # the first step closes only when the next one begins
        if target is not None:
            target.update({k: HostCopy.of(self.torch, v) for k, v in values.items() if v is not None})
        return True

    def should_stop(self) -> bool:
        at, _ = stop.agreed_step(self.probe.stop_at, self.step_limit)
        return at is not None and self.tracker.step - 1 >= at

    # --- the end ------------------------------------------------------------------------
    def _on_crash(self, exc: BaseException) -> None:
        """Uncaught: crashed, but a SIGINT stopped it, also before the stop's command was read (run/outcome
        makes it `failed` where torchrun says that failed the run); the stop's own says so at exit."""
        self.crashed = not isinstance(exc, KeyboardInterrupt)
        if not self.crashed and (self._stopping or self.probe.stop_at is not None):
            return
        self._call(blame_settings, exc, self.ddps, self.note)
        self._call(lambda: self._report(self.tracker.ready()))  # steps closed, not yet read (READ_EVERY_S)
        self.probe.close("crashed" if self.crashed else "stopped")  # at once: its peers fail next

    def flush(self) -> None:
        """Every step so far to the hub now (training is over: the process group goes, or the process ends)."""
        if not self.probe.connected:
            return
        self.cost.run_ends()
        self._call(self.cost.write, os.environ.get(protocol.ENV_CONFIG))
        self._call(self._last_steps)  # a dying CUDA context may refuse: a note says so
        self.send_facts({"steps_run": self.tracker.step})  # every step counted, timed or not (phase_every)
        self.probe.flush()

    def _last_steps(self) -> None:
        self.tracker.finish()
        self._report(self.tracker.ready(flush=True), flush=True)

    def finish(self, reason: str | None = None) -> None:
        """Last steps, then goodbye (at exit, or when the script closes its probe)."""
        if not self.probe.connected:
            return
        self.flush()
        if reason is None or (reason == "stopped" and self._limit_reached):  # the run's own limit: completed
            stopped = (self._stopping or self.probe.stop_at is not None) and not self._limit_reached
            reason = "crashed" if self.crashed else ("stopped" if stopped else "completed")
        self._let_go()
        self.probe.close(reason, self._ddp_timing)

    def _let_go(self) -> None:
        """Process groups gone (or the run ends): the DDPs let go, freed as without ddptop (gloo torn down late aborts)."""
        self._ddp_timing = ddp_timing(self.ddps[0]) if self.ddps else self._ddp_timing
        self.ddps, self.replicas, self.comm.timers = [], {}, {}
        self.hooked.release()

    def _os_exit(self, status: int) -> None:
        self.exit_status = status
        self._at_exit()

    def _at_exit(self) -> None:
        failed = self.exit_status not in (None, 0) and not self._stopping and not self.crashed
        self.finish("failed" if failed else None)
