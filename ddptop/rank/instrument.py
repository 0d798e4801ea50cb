"""The rank-side instrument: measures any training script through torch's own hooks.

Attached once torch is imported (ddptop.rank.attach); from then on:
- optimizer steps (torch.optim's global step hooks, GradScaler.step) end steps;
- forwards are timed by hooks on every DistributedDataParallel module (its __init__ is
  wrapped), or, without DDP, on the top modules seen in the first step (global module
  hooks for that step only);
- backward: a hook on the forward's output marks its start; autograd callbacks mark the
  end of its compute and, chained after DDP's own, its return (all-reduces done);
- communication: CommTimer on each DDP module (ddptop.rank.comm);
- a user script's run settings: the DDP knobs the run applies (ddp_apply) go into the
  script's own DDP() call and comm hook registration (ScriptSettings), conflicts are notes;
- the run's stop and capture commands act at step boundaries, inside the optimizer hook (and
  a user script's step limit, warmup + script_steps).
Nothing here may raise into the user's code except the agreed stop (SystemExit).
"""

from __future__ import annotations

import atexit
import functools
import inspect
import os
import sys
import time
from pathlib import Path
from typing import Any

from ddptop.probe import Probe
from ddptop.rank.capture import CaptureRunner
from ddptop.rank.clock import CudaClock, HostClock
from ddptop.rank.comm import CommTimer, NcclTimes
from ddptop.rank.steps import StepTracker

NOT_DDP = {  # the wrapper classes whose communication ddptop does not time, and what they are
    "FullyShardedDataParallel": "FSDP", "FSDPModule": "FSDP (fully_shard)", "DeepSpeedEngine": "DeepSpeed",
}


class Instrument:
    def __init__(self, torch: Any, probe: Probe, rank: int, settings: dict[str, Any]) -> None:
        self.torch = torch
        self.probe = probe
        self.rank = rank
        self.comm_timing = bool(settings.get("comm_timing", True))
        self.timing_every = max(1, int(settings.get("comm_timing_every", 10)))
        self.clock: Any = None
        self.tracker = StepTracker(_LazyClock(self))
        self.captures: CaptureRunner | None = None
        self.ddps: list[Any] = []
        self.timers: dict[int, CommTimer] = {}  # id(ddp) -> its timer
        # NCCL's own timing where DDP keeps its C++ all-reduce: id(process group) -> its times
        self.nccl_times: dict[int, NcclTimes] = {}
        self._nccl_timed: dict[int, int] = {}  # id(ddp) -> its gradient bytes per step (0: a hook changes them)
        self._exposed_only: set[int] = set()  # id(ddp): DDP's C++ all-reduce, exposed comm only
        self._closed_at: dict[int, float] = {}  # step -> host time it closed (steady clock)
        self._held: list[dict[str, Any]] = []  # records waiting for NCCL to report their all-reduces
        self._top: dict[int, Any] = {}  # id -> module seen as outermost in the first step (no DDP)
        self._depth = 0
        self._global_hooks: list[Any] = []
        self._in_backward = False
        self._after_window = False
        self._stopping = False
        self.api_used = False  # the script calls Probe.tick()/record() itself
        self.facts_sent: dict[str, Any] = {}
        self.script_facts: dict[str, Any] = {}
        self.notes_sent: set[str] = set()
        self.batch_known = False
        self.crashed = False
        self.exit_status: Any = None  # what the script passed to sys.exit()
        self.script = ScriptSettings.of(settings)  # None: ddptop's trainer applies its own settings
        self.step_limit = self.script.last_step if self.script is not None else None
        self._limit_reached = False
        self._left = False  # the instrument destroyed the process group at the step limit
        self._applied_hooks: dict[int, str] = {}  # id(ddp) -> the comm hook ddptop set on it
        self._untimed: set[int] = set()  # timers that only carry a hook ddptop set (comm_timing off)
        self._autocast_checked = False

    # --- installation -------------------------------------------------------------------
    def install(self) -> None:
        torch = self.torch
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        register_optimizer_step_pre_hook(self._guard(self._opt_pre))
        register_optimizer_step_post_hook(self._guard(self._opt_post))
        self._wrap_grad_scaler()
        self._wrap_ddp(torch.nn.parallel.DistributedDataParallel)
        self._wrap_destroy(torch.distributed)
        self._install_global_hooks()
        facts: dict[str, Any] = {"torch": str(torch.__version__)}
        self.send_facts(facts)
        self._chain_excepthook()
        self._watch_exit_code()
        atexit.register(self._at_exit)

    def _guard(self, fn: Any) -> Any:
        """A hook that never raises into the user's code (except the agreed stop)."""

        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except SystemExit:
                raise
            except Exception as exc:  # noqa: BLE001
                self.note(f"ddptop instrument error in {fn.__name__}: {type(exc).__name__}: {exc}")
                return None

        return guarded

    def _wrap_grad_scaler(self) -> None:
        amp = getattr(self.torch, "amp", None)
        scaler = getattr(amp, "GradScaler", None)
        if scaler is None or getattr(scaler.step, "_ddptop", False):
            return
        original = scaler.step
        inst = self

        @functools.wraps(original)
        def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            # a step that GradScaler skips (inf/NaN gradients) is still the script's step
            inst._opt_pre_safe(optimizer)
            try:
                return original(self, optimizer, *args, **kwargs)
            finally:
                inst._opt_post_safe(optimizer)

        step._ddptop = True  # type: ignore[attr-defined]
        scaler.step = step

    def _wrap_ddp(self, ddp_class: Any) -> None:
        if getattr(ddp_class.__init__, "_ddptop", False):
            return
        init, register, builtin = ddp_class.__init__, ddp_class.register_comm_hook, ddp_class._register_builtin_comm_hook
        inst = self

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            change = inst._guard(inst._script_kwargs)(init, self, args, kwargs) if inst.script else None
            if change is not None:
                args, kwargs = change
            init(self, *args, **kwargs)
            inst._guard(inst._on_ddp)(self)

        @functools.wraps(register)
        def register_comm_hook(self: Any, state: Any, hook: Any) -> Any:
            timer = inst.timers.get(id(self))
            if timer is None and id(self) in inst._exposed_only:  # a Python hook now: time around it
                timer = inst._guard(inst._make_timer)(self)
                inst.send_facts({"comm_timing": "per-bucket hook around the script's comm hook"})
            if timer is None:  # NCCL times it, comm timing off, or not our DDP
                if id(self) in inst._nccl_timed:
                    inst._nccl_timed[id(self)] = 0  # its hook decides what travels: bytes unknown
                    inst.send_facts({"comm_hook": getattr(hook, "__qualname__", None) or repr(hook)[:80]})
                return register(self, state, hook)
            inst._guard(inst._script_hook_wins)(self, hook)
            first = timer.user is None and not getattr(self, "_ddptop_hooked", False)
            timer.user = (state, hook)
            inst.send_facts({"comm_hook": timer.hook_name()})
            if first:
                self._ddptop_hooked = True
                return register(self, None, timer.hook)
            return None  # ours is registered already: it now runs the script's hook

        @functools.wraps(builtin)
        def register_builtin(self: Any, comm_hook_type: Any) -> Any:
            inst._guard(inst._script_hook_wins)(self, comm_hook_type)
            inst.timers.pop(id(self), None)
            if id(self) in inst._nccl_timed:
                inst._nccl_timed[id(self)] = 0
            else:
                inst.note("DDP's built-in C++ comm hook is registered: per-bucket communication is not timed")
            return builtin(self, comm_hook_type)

        __init__._ddptop = True  # type: ignore[attr-defined]
        ddp_class.__init__ = __init__
        ddp_class.register_comm_hook = register_comm_hook
        ddp_class._register_builtin_comm_hook = register_builtin
        self._register = register

    def _wrap_destroy(self, dist: Any) -> None:
        """Steps are sent before the process group goes: a rank that then dies in teardown
        (gloo has aborted there) has reported all of them."""
        original = getattr(dist, "destroy_process_group", None)
        if original is None or getattr(original, "_ddptop", False):
            return

        @functools.wraps(original)
        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            self._guard(self.flush)()
            if self._left and not dist.is_initialized():
                return None
            return original(*args, **kwargs)

        destroy_process_group._ddptop = True  # type: ignore[attr-defined]
        dist.destroy_process_group = destroy_process_group

    def _install_global_hooks(self) -> None:
        from torch.nn.modules import module as nn_module

        compiling = getattr(getattr(self.torch, "compiler", None), "is_compiling", lambda: False)

        def pre(module: Any, args: Any) -> None:
            if compiling():
                return
            self._depth += 1
            if self._depth == 1:
                self._top.setdefault(id(module), module)
                self._fwd_pre(module, args, {})

        def post(module: Any, args: Any, output: Any) -> None:
            if compiling():
                return
            self._depth -= 1
            if self._depth == 0:
                self._fwd_post(module, args, output)

        self._global_hooks = [nn_module.register_module_forward_pre_hook(self._guard(pre)),
                              nn_module.register_module_forward_hook(self._guard(post), always_call=True)]

    def _drop_global_hooks(self) -> None:
        for handle in self._global_hooks:
            handle.remove()
        self._global_hooks = []
        self._depth = 0

    def _hook_module(self, module: Any) -> None:
        module.register_forward_pre_hook(self._guard(self._fwd_pre), with_kwargs=True)
        module.register_forward_hook(self._guard(self._fwd_post), always_call=True)

    # --- DDP ----------------------------------------------------------------------------
    def _on_ddp(self, ddp: Any) -> None:
        self._drop_global_hooks()
        self.ddps.append(ddp)
        self._choose_clock(ddp.module)
        self._hook_module(ddp)
        dist = self.torch.distributed
        facts = self._model_facts(ddp.module)
        facts.update({
            "ddp": True, "backend": str(dist.get_backend(ddp.process_group)), "world_size": dist.get_world_size(),
            "static_graph": bool(getattr(ddp, "static_graph", False)),
            "gradient_as_bucket_view": bool(getattr(ddp, "gradient_as_bucket_view", False)),
            "find_unused_parameters": bool(getattr(ddp, "find_unused_parameters", False)),
        })
        cap = getattr(ddp, "bucket_bytes_cap", None)
        if isinstance(cap, int):
            facts["bucket_cap_mb"] = round(cap / 2**20, 3)
        hook = self._script_hook(ddp) if self.script is not None else None
        cuda = self.clock is not None and isinstance(self.clock, CudaClock)
        if self.comm_timing and hook is None and cuda:
            # DDP keeps its C++ all-reduce: a Python hook per bucket cost ~3.5% of a ViT-L step
            # on one H100 (docs/BENCHMARKS.md); backward's events give exposed comm every step
            self.tracker.comm_elsewhere = True
            if self._time_by_nccl(ddp):
                facts["comm_timing"] = "NCCL's own timing of each all-reduce (nccl_timing), DDP's C++ all-reduce"
            else:
                self._exposed_only.add(id(ddp))
                facts["comm_timing"] = ("exposed communication from backward's events, DDP's C++ all-reduce "
                                        "(nccl_timing=true: all-reduce time too)")
        elif self.comm_timing or hook is not None:
            timer = self._make_timer(ddp)
            if hook is not None:  # the run's hook, through the timer as if the script had registered it
                timer.user = hook
                if not self.comm_timing:
                    self._untimed.add(id(ddp))
            # registered at the first forward, so that a hook the script registers after
            # DDP() is wrapped instead of refused (DDP takes one registration)
            facts["comm_timing"] = "per-bucket hook" + ("" if not cuda else f", completions every {self.timing_every} steps")
        if not self.comm_timing:
            facts["comm_timing"] = "off"
        self.send_facts(facts)
        if self.script is not None:
            self._send_script_facts(ddp)

    def _make_timer(self, ddp: Any) -> CommTimer:
        cuda = isinstance(self.clock, CudaClock)
        timer = CommTimer(self.torch.distributed, self.tracker.clock.stamp, self.tracker.add_comm,
                          average_in_nccl=cuda, group=ddp.process_group)
        timer.timed = self._timed(self.tracker.step) and self.comm_timing
        self.timers[id(ddp)] = timer
        self._exposed_only.discard(id(ddp))
        return timer

    def _time_by_nccl(self, ddp: Any) -> bool:
        """NCCL times this DDP's all-reduces (its group's completion hook, shared by every
        DDP on the group), where the run asked for it (TORCH_NCCL_ENABLE_TIMING)."""
        pg = ddp.process_group
        times = self.nccl_times.get(id(pg)) or NcclTimes.attach(self.torch.distributed, pg)
        if times is None:
            return False
        self.nccl_times[id(pg)] = times
        self._nccl_timed[id(ddp)] = sum(p.numel() * p.element_size() for p in ddp.module.parameters()
                                        if p.requires_grad)
        return True

    def _register_timer(self, ddp: Any) -> None:
        timer = self.timers.get(id(ddp))
        if timer is None or getattr(ddp, "_ddptop_hooked", False):
            return
        ddp._ddptop_hooked = True
        self._register(ddp, None, timer.hook)
        self.send_facts({"comm_hook": timer.hook_name()})

    def _model_facts(self, module: Any) -> dict[str, Any]:
        inner = getattr(module, "_orig_mod", None)  # torch.compile's OptimizedModule
        name = type(inner if inner is not None else module).__name__ + (" (compiled)" if inner is not None else "")
        params = sum(p.numel() for p in module.parameters())
        return {"model": name, "params": params, "device": self._device_name(module)}

    def _device_name(self, module: Any) -> str:
        param = next(module.parameters(), None)
        if param is None or param.device.type != "cuda":
            return "cpu" if param is None else str(param.device)
        idx = param.device.index if param.device.index is not None else self.torch.cuda.current_device()
        return f"{self.torch.cuda.get_device_name(idx)} (cuda:{idx})"

    def _choose_clock(self, module: Any) -> None:
        if self.clock is not None:
            return
        param = next(module.parameters(), None)
        if param is not None and param.device.type == "cuda":
            self.clock = CudaClock(self.torch, param.device)
        else:
            self.clock = HostClock()
        self.captures = CaptureRunner(self.torch, self.probe, self.rank, isinstance(self.clock, CudaClock))

    # --- forward / backward --------------------------------------------------------------
    def _fwd_pre(self, module: Any, args: Any, kwargs: Any = None) -> None:
        if self.clock is None:
            self._choose_clock(module)
        if self.timers:
            self._register_timer(module)
        samples = 0.0
        if self.script is not None and not self._autocast_checked and self.ddps and module is self.ddps[-1]:
            self._autocast_checked = True
            self._check_autocast(module)
        if self.torch.is_grad_enabled():
            batch = _batch_size(self.torch, args, kwargs)
            if batch:
                samples = float(batch)
                if not self.batch_known:
                    self.batch_known = True
                    self.send_facts({"batch_size": batch})
        self.tracker.mark("fwd", samples)

    def _fwd_post(self, module: Any, args: Any, *rest: Any) -> None:  # noqa: ARG002
        output = rest[-1] if rest else None
        self.tracker.mark("fwd_end")
        if not self.torch.is_grad_enabled():
            return
        tensor = _loss_like(self.torch, output)
        if tensor is not None:
            tensor.register_hook(self._guard(self._bwd_start))

    def _bwd_start(self, grad: Any) -> None:  # noqa: ARG002
        if self._in_backward:
            return None
        self._in_backward = True
        self.tracker.mark("bwd")
        engine = self.torch.autograd.Variable._execution_engine

        def compute_end() -> None:
            self.tracker.mark("bwd_end")
            # queued now, so it runs after DDP's finalize (queued during backward): backward
            # has returned, every all-reduce is done and its result copied back
            engine.queue_callback(self._guard(returned))

        def returned() -> None:
            self._in_backward = False
            self.tracker.mark("bwd_ret")

        engine.queue_callback(self._guard(compute_end))
        return None

    # --- optimizer steps = step boundaries -----------------------------------------------
    def _opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:  # noqa: ARG002
        self._opt_pre_safe(optimizer)

    def _opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:  # noqa: ARG002
        self._opt_post_safe(optimizer)

    def _opt_pre_safe(self, optimizer: Any) -> None:
        try:
            closed = self.tracker.opt_begin(id(optimizer))
        except Exception as exc:  # noqa: BLE001
            self.note(f"ddptop instrument error at an optimizer step: {type(exc).__name__}: {exc}")
            return
        if closed is not None:
            self._closed(closed)

    def _opt_post_safe(self, optimizer: Any) -> None:
        try:
            closed = self.tracker.opt_end(id(optimizer))
        except Exception as exc:  # noqa: BLE001
            self.note(f"ddptop instrument error at an optimizer step: {type(exc).__name__}: {exc}")
            return
        if closed is not None:
            self._closed(closed)

    def _closed(self, step: int) -> None:
        """Step `step` ended: report, stop if agreed, open/close capture windows."""
        if self.nccl_times:
            self._closed_at[step] = time.monotonic()
        try:
            self._after_close(step)
        except Exception as exc:  # noqa: BLE001
            self.note(f"ddptop instrument error after step {step}: {type(exc).__name__}: {exc}")
        stop_at = self.probe.stop_at
        limit = self.step_limit
        if limit is not None and step >= limit and (stop_at is None or limit <= stop_at) and not self._stopping:
            self._limit_reached = True
            stop_at = limit
        if stop_at is not None and step >= stop_at and not self.api_used and not self._stopping:
            self._stopping = True
            why = (f"the run's {self.script.steps} steps after warmup are done" if self._limit_reached and self.script
                   else "as every rank agreed")
            print(f"ddptop: rank {self.rank} stops after step {step}, {why}", file=sys.stderr, flush=True)
            if self._limit_reached:
                self._guard(self._leave_together)()
            raise SystemExit(0)

    def _after_close(self, step: int) -> None:
        tracker = self.tracker
        closed = tracker.pending[-1][3] if tracker.pending else {}
        compressing = [t.compressing() for t in self.timers.values()]
        if any(c is not None for c in compressing):
            closed["compressing"] = max(c for c in compressing if c is not None)
        if step == 0 and not self.ddps:
            self._first_step_without_ddp()
        self._report(tracker.ready(keep_last=self.api_used))
        caps = self.captures
        after = False
        if caps is not None:
            if caps.end_step(step):
                after = True
                tracker.restart()
            caps.poll(step + 1)
            caps.begin_step(step + 1)
            if caps.active is not None or after:
                # a window's steps, and the one after it (which may wait for a peer still
                # writing its trace), are not typical steps
                tracker.extra["profiled"] = 1
        timed = self._timed(step + 1)
        for key, timer in self.timers.items():
            timer.timed = timed and key not in self._untimed

    def _timed(self, step: int) -> bool:
        cuda = isinstance(self.clock, CudaClock)
        active = self.captures is not None and self.captures.active is not None
        return not cuda or step % self.timing_every == 0 or active

    def _first_step_without_ddp(self) -> None:
        """No DDP module: keep timing the outermost modules of the first step, drop the
        global hooks (they would cost every submodule call)."""
        self._drop_global_hooks()
        tops = list(self._top.values())
        self._top = {}
        for module in tops:
            self._hook_module(module)
        facts: dict[str, Any] = {"ddp": False}
        kinds = {NOT_DDP[type(m).__name__] for m in tops if type(m).__name__ in NOT_DDP}
        if tops:
            facts.update(self._model_facts(tops[0]))
        dist = self.torch.distributed
        if dist.is_available() and dist.is_initialized():
            facts["backend"] = str(dist.get_backend())
            facts["world_size"] = dist.get_world_size()
            what = " and ".join(sorted(kinds)) if kinds else "no DistributedDataParallel module"
            self.note(f"{what}: gradient communication is not measured (ddptop times DDP's all-reduce); "
                      "steps and phases are")
        else:
            facts["backend"] = "none"
        self.send_facts(facts)

    def _report(self, records: list[dict[str, Any]], flush: bool = False) -> None:
        if self.nccl_times:
            records = self._with_nccl_times(records, flush)
        for rec in records:
            for key, value in list(rec.items()):
                if isinstance(value, _Copy):
                    read = value.read(wait=flush)
                    if read is None:
                        del rec[key]
                    else:
                        rec[key] = read
                elif hasattr(value, "item"):  # a CPU tensor: reading it costs nothing
                    try:
                        rec[key] = float(value.item())
                    except Exception:  # noqa: BLE001
                        del rec[key]
            self.probe.record(int(rec.pop("step")), **rec)

    def _with_nccl_times(self, records: list[dict[str, Any]], flush: bool) -> list[dict[str, Any]]:
        """Records whose all-reduces NCCL has reported (one issued after the step closed has
        been: they complete in order), with comm_ms (the kernels' time), buckets and bytes.
        A record waits at most a few steps; one still unreported then goes without comm_ms,
        like a step the Python hook does not time."""
        self._held.extend(records)
        if flush and self._held:
            time.sleep(0.25)  # the end of the run: NCCL's watchdog reports every ~0.1 s
        out = []
        while self._held:
            rec = self._held[0]
            closed = self._closed_at.get(int(rec["step"]))
            times = list(self.nccl_times.values())
            reported = closed is not None and all(t.reported_after(closed) for t in times)
            if not (reported or flush or len(self._held) > 4 or closed is None):
                break
            self._held.pop(0)
            self._closed_at.pop(int(rec["step"]), None)
            if closed is not None and (reported or flush):
                durations = [d for t in times for d in t.take(closed)]
                if durations:
                    rec["comm_ms"] = sum(durations)  # one stream per group: they do not overlap
                    rec["buckets"] = float(len(durations))
                    per_step = list(self._nccl_timed.values())
                    if all(per_step):
                        rec["comm_bytes"] = float(sum(per_step))
            elif closed is not None:
                for t in times:
                    t.take(closed)  # too late for this step: its all-reduces are dropped
            out.append(rec)
        return out

    # --- the script's own probe calls ----------------------------------------------------
    def user_values(self, values: dict[str, Any]) -> bool:
        """Values from Probe.tick()/record() join the newest closed step. False when the
        instrument has seen no optimizer step to join them to."""
        self.api_used = True
        tracker = self.tracker
        if not tracker.seen_opt:
            return False
        target = tracker.last_closed
        if target is None and tracker.step == 0:
            target = tracker.extra  # the first step closes only when the next one begins
        if target is not None:
            target.update({k: _Copy.of(self.torch, v) for k, v in values.items() if v is not None})
        return True

    def should_stop(self) -> bool:
        stop_at = self.probe.stop_at
        if self.step_limit is not None and (stop_at is None or self.step_limit < stop_at):
            stop_at = self.step_limit
        return stop_at is not None and self.tracker.step - 1 >= stop_at

    # --- a user script's run settings ----------------------------------------------------
    def _script_kwargs(self, init: Any, ddp: Any, args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """The script's DDP() arguments with the run's knobs put in; what it asked for and
        what changed are kept for the facts sent once DDP exists."""
        script = self.script
        assert script is not None
        sig = _signature(init)
        try:
            bound = sig.bind(ddp, *args, **kwargs)
        except TypeError:
            return None  # DDP itself says what is wrong with the call
        asked = {}
        for name in DDP_ARGS:
            param = sig.parameters.get(name)
            value = bound.arguments.get(name, param.default if param is not None else None)
            asked[name] = 25.0 if name == "bucket_cap_mb" and value is None else value  # DDP's default
        changes = {}
        for name in DDP_ARGS:
            if name in script.apply and name in sig.parameters and script.values[name] != asked[name]:
                bound.arguments[name] = script.values[name]
                changes[name] = f"{_show(asked[name])}->{_show(script.values[name])}"
        if script.values.get("static_graph") and "static_graph" in changes and asked.get("find_unused_parameters"):
            self.note("static_graph=True set by ddptop on a DDP built with find_unused_parameters=True: if the "
                      "parameters used change between iterations DDP stops with an error; then run without static")
        ddp._ddptop_asked = asked
        ddp._ddptop_changes = changes
        return tuple(bound.args[1:]), dict(bound.kwargs)

    def _script_hook(self, ddp: Any) -> tuple[Any, Any] | None:
        """(state, hook) for the comm hook the run sets on the script's DDP, or None."""
        script = self.script
        if script is None or "comm_hook" not in script.apply or script.values.get("comm_hook", "none") == "none":
            return None
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        name = script.values["comm_hook"]
        group = getattr(ddp, "process_group", None)
        if name == "powersgd":
            state = powerSGD_hook.PowerSGDState(
                process_group=group, matrix_approximation_rank=int(script.values.get("powersgd_rank", 1)),
                start_powerSGD_iter=int(script.values.get("powersgd_start_iter", 2)))
            hook: Any = (state, powerSGD_hook.powerSGD_hook)
        elif name in ("bf16", "fp16"):
            hook = (group, getattr(default_hooks, f"{name}_compress_hook"))
        else:
            return None
        self._applied_hooks[id(ddp)] = name
        ddp._ddptop_changes = {**getattr(ddp, "_ddptop_changes", {}), "comm_hook": f"none->{name}"}
        return hook

    def _script_hook_wins(self, ddp: Any, hook: Any) -> None:
        """The script registers its own comm hook: it is kept, and the one the run asked
        for is not applied (never a silent no-op, never a lossy hook the script did not ask for)."""
        script = self.script
        if script is None or "comm_hook" not in script.apply:
            return
        asked = script.values.get("comm_hook", "none")
        applied = self._applied_hooks.pop(id(ddp), None)
        own = getattr(hook, "__qualname__", None) or getattr(hook, "name", None) or repr(hook)[:60]
        self.note(f"the script registers its own comm hook ({own}): ddptop keeps it and does not apply "
                  f"comm_hook={asked}")
        if applied is not None:
            changes = dict(getattr(ddp, "_ddptop_changes", {}))
            changes.pop("comm_hook", None)
            ddp._ddptop_changes = changes
            self._send_script_facts(ddp)

    def _send_script_facts(self, ddp: Any) -> None:
        asked = getattr(ddp, "_ddptop_asked", None)
        changes = getattr(ddp, "_ddptop_changes", {})
        facts: dict[str, Any] = {"ddp_set": ", ".join(f"{k} {v}" for k, v in changes.items()) or "nothing (as is)"}
        if asked:
            facts["ddp_asked"] = ", ".join(f"{k}={_show(v)}" for k, v in asked.items() if k in DDP_ARGS[:3])
        self.send_facts(facts)

    def _check_autocast(self, ddp: Any) -> None:
        """The script's own autocast at its first forward, against what the run asked for:
        ddptop does not change a script's compute precision, so a mismatch is said."""
        torch = self.torch
        device = "cuda" if isinstance(self.clock, CudaClock) else "cpu"
        try:
            enabled = bool(torch.is_autocast_enabled(device))
            dtype = torch.get_autocast_dtype(device) if enabled else None
        except (TypeError, AttributeError):  # torch before 2.4
            enabled = bool(torch.is_autocast_enabled() if device == "cuda" else torch.is_autocast_cpu_enabled())
            dtype = None
        names = {torch.bfloat16: "bf16", torch.float16: "fp16"}
        seen = "none" if not enabled else names.get(dtype, str(dtype).removeprefix("torch.") if dtype else "on")
        self.send_facts({"autocast": seen})
        script = self.script
        if script is None or "autocast" not in script.apply:
            return
        asked = script.values.get("autocast", "none")
        if asked != seen:
            self.note(f"autocast={asked} asked, but the script's forward runs with autocast {seen}: ddptop does "
                      "not change a script's compute precision (use torch.autocast in the script)")

    # --- facts and notes ----------------------------------------------------------------
    def send_facts(self, facts: dict[str, Any], from_script: bool = False) -> None:
        """Send facts not sent yet; what the script said itself (Probe.connect(model=...))
        is not replaced by what the instrument reads."""
        if from_script:
            self.script_facts.update(facts)
        fresh = {k: v for k, v in facts.items()
                 if self.facts_sent.get(k) != v and (from_script or k not in self.script_facts)}
        if fresh:
            self.facts_sent.update(fresh)
            self.probe.info(fresh, [])

    def note(self, text: str) -> None:
        if text not in self.notes_sent and len(self.notes_sent) < 16:
            self.notes_sent.add(text)
            self.probe.info({}, [text[:500]])
            print(f"ddptop: rank {self.rank}: {text}", file=sys.stderr, flush=True)

    # --- the end ------------------------------------------------------------------------
    def _chain_excepthook(self) -> None:
        previous = sys.excepthook

        def hook(*exc_info: Any) -> None:
            if not issubclass(exc_info[0], SystemExit):
                self.crashed = True
                self._guard(self._blame_settings)(exc_info[1])
                self.probe.close("crashed")  # at once: its peers fail next
            previous(*exc_info)

        sys.excepthook = hook

    def _leave_together(self) -> None:
        """Every rank stops at the same step of its own accord (the step limit): they leave
        the process group together, as a script that ends cleanly does (a gloo rank whose
        peer has already gone can abort at exit)."""
        dist = self.torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            return
        dist.barrier()
        dist.destroy_process_group()
        self._left = True  # the script's own destroy_process_group() on its way out is a no-op

    def _blame_settings(self, exc: Any) -> None:
        """A crash that a setting ddptop applied caused says so (static_graph on a graph that
        changes between iterations is DDP's RuntimeError at the second backward)."""
        text = str(exc)
        set_static = any("static_graph" in getattr(d, "_ddptop_changes", {}) for d in self.ddps)
        if set_static and ("static_graph" in text or "graph has changed" in text):
            self.note("static_graph=True, set by ddptop, does not fit this script: its graph changes between "
                      "iterations (run it without static_graph)")

    def flush(self) -> None:
        """Every step so far to the hub now (training is over: the process group goes, or
        the process ends)."""
        if self.probe._sock is None:
            return
        try:
            self.tracker.finish()
            self._report(self.tracker.ready(flush=True), flush=True)
        except Exception as exc:  # noqa: BLE001 - a dying CUDA context, say
            self.note(f"the last steps could not be read: {type(exc).__name__}: {exc}")
        self.probe._flush()

    def finish(self, reason: str | None = None) -> None:
        """Last steps, then goodbye (at exit, or when the script closes its probe)."""
        if self.probe._sock is None:
            return
        self.flush()
        if reason is None:
            stopped = self._stopping and not self._limit_reached
            reason = "crashed" if self.crashed else ("stopped" if stopped else "completed")
        self.probe.close(reason, _ddp_timing(self.ddps[0]) if self.ddps else None)

    def _watch_exit_code(self) -> None:
        """sys.exit(2) (argparse, a script giving up) is not a completed rank."""
        original = sys.exit

        def exit(status: Any = None) -> Any:
            self.exit_status = status
            return original(status)

        sys.exit = exit

    def _at_exit(self) -> None:
        status = self.exit_status
        failed = status not in (None, 0) and not self._stopping and not self.crashed
        self.finish("failed" if failed else None)


DDP_ARGS = ("static_graph", "gradient_as_bucket_view", "bucket_cap_mb", "find_unused_parameters")


class ScriptSettings:
    """What the run's config.json says for a user's own script: the DDP knobs to apply
    (ddp_apply) with their values, and its step limit. None for ddptop's trainer, which
    builds its DDP from the same config itself."""

    def __init__(self, apply: tuple[str, ...], values: dict[str, Any], warmup: int, steps: int) -> None:
        self.apply, self.values, self.warmup, self.steps = apply, values, warmup, steps

    @classmethod
    def of(cls, settings: dict[str, Any]) -> ScriptSettings | None:
        launch = settings.get("_launch")
        if not isinstance(launch, dict) or not launch.get("user_cmd"):
            return None
        apply = tuple(n.strip() for n in str(settings.get("ddp_apply") or "").split(",") if n.strip())
        values = {k: settings[k] for k in (*apply, "powersgd_rank", "powersgd_start_iter") if k in settings}
        return cls(apply, values, int(settings.get("warmup") or 0), int(settings.get("script_steps") or 0))

    @property
    def last_step(self) -> int | None:
        """The step after which the script is stopped (None: it runs to its own end)."""
        return self.warmup + self.steps - 1 if self.steps > 0 else None


@functools.lru_cache(maxsize=8)
def _signature(fn: Any) -> inspect.Signature:
    return inspect.signature(fn)


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


class _Copy:
    """A GPU scalar the script handed over (its loss): copied to pinned host memory without
    waiting, read once the copy has run. `.item()` would wait for everything queued on the
    stream, every step: measured at 6-7% of a ViT-L/32 step on an H100."""

    def __init__(self, torch: Any, tensor: Any) -> None:
        self.host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        with torch.cuda.device(tensor.device):
            self.host.copy_(tensor.detach(), non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record(torch.cuda.current_stream(tensor.device))

    @classmethod
    def of(cls, torch: Any, value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.is_cuda and value.numel() == 1:
            try:
                return cls(torch, value)
            except Exception:  # noqa: BLE001 - no pinned memory: leave the value out
                return None
        return value

    def read(self, wait: bool = False) -> float | None:
        if wait:
            self.event.synchronize()
        elif not self.event.query():
            return None
        return float(self.host.item())


class _LazyClock:
    """The tracker's clock until the model's device is known (the first DDP or forward)."""

    def __init__(self, inst: Instrument) -> None:
        self._inst = inst

    def _clock(self) -> Any:
        if self._inst.clock is None:
            self._inst.clock = HostClock()
        return self._inst.clock

    def stamp(self) -> Any:
        return self._clock().stamp()

    def elapsed(self, a: Any, b: Any) -> float:
        if isinstance(a, float) != isinstance(b, float):
            return 0.0  # stamped before and after the clock was chosen
        return self._clock().elapsed(a, b)

    def done(self, stamp: Any) -> bool:
        return isinstance(stamp, float) or self._clock().done(stamp)

    def sync(self) -> None:
        self._clock().sync()


def _batch_size(torch: Any, args: Any, kwargs: Any) -> int | None:
    """The first dimension of the first tensor the forward was given."""
    tensor = _first_tensor(torch, (args, kwargs or {}), depth=0, want_grad=False)
    return int(tensor.shape[0]) if tensor is not None and tensor.dim() >= 1 else None


def _loss_like(torch: Any, output: Any) -> Any:
    """The tensor in a forward's output whose gradient arrives first in backward: a scalar
    that requires grad (a loss computed inside the model), else the first that does."""
    scalar = _first_tensor(torch, output, depth=0, want_grad=True, scalar=True)
    return scalar if scalar is not None else _first_tensor(torch, output, depth=0, want_grad=True)


def _first_tensor(torch: Any, value: Any, depth: int, want_grad: bool, scalar: bool = False) -> Any:
    if isinstance(value, torch.Tensor):
        if want_grad and not value.requires_grad:
            return None
        if scalar and value.dim() != 0:
            return None
        return value
    if depth > 3:
        return None
    if isinstance(value, dict):
        items: Any = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    elif hasattr(value, "to_tuple"):  # Hugging Face ModelOutput
        items = value.to_tuple()
    else:
        return None
    for item in list(items)[:16]:
        found = _first_tensor(torch, item, depth + 1, want_grad, scalar)
        if found is not None:
            return found
    return None


def _ddp_timing(ddp: Any) -> dict[str, float]:
    """DDP's own timing from its logger, in ms: it times a sample of iterations (the first
    ten, then one in a hundred), so it cross-checks ddptop's per-step figures, no more."""
    try:
        data = ddp._get_ddp_logging_data()
    except Exception:  # noqa: BLE001 - a private API; its absence only loses the cross-check
        return {}
    keys = {"avg_backward_comm_time": "backward_comm_ms", "avg_backward_compute_comm_overlap_time": "overlap_ms",
            "avg_backward_compute_time": "backward_compute_ms", "avg_forward_compute_time": "forward_compute_ms"}
    out = {name: data[key] / 1e6 for key, name in keys.items() if isinstance(data.get(key), int | float)}
    if out and isinstance(data.get("iteration"), int):
        out["iteration"] = float(data["iteration"])
    return out


def stacks_on_sigusr1(rank: int) -> bool:
    """ddptop sends SIGUSR1 when the run stalls: every thread's stack goes to the run's stacks/."""
    import faulthandler
    import signal

    from ddptop.wire import protocol

    config_path = os.environ.get(protocol.ENV_CONFIG)
    if not config_path:
        return False
    stacks = Path(config_path).parent / "stacks"
    if stacks.is_dir():
        out = open(stacks / f"rank{rank}.txt", "w")  # noqa: SIM115 - kept open for faulthandler
        faulthandler.register(signal.SIGUSR1, file=out, all_threads=True, chain=False)
        return True
    return False
