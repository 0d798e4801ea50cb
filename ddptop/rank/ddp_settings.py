"""A user script's run settings applied to its own DDP: the knobs the run applies
(config.json's ddp_apply) go into the script's DDP() call and comm hook registration; what
the script asked for and what ddptop changed are sent as facts; a conflict (the script's own
comm hook, its own autocast, static_graph on a graph that changes) is a note, never a
silent no-op. ddptop's own trainer builds its DDP from the same config itself: no settings
here (`ScriptSettings.of` is None)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

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


class ScriptDdp:
    """Puts a run's settings into a user script's DDP and says what is in effect."""

    def __init__(self, torch: Any, script: ScriptSettings, note: Callable[[str], None],
                 send_facts: Callable[[dict[str, Any]], None]) -> None:
        self.torch = torch
        self.script = script
        self.note = note
        self.send_facts = send_facts
        self._applied_hooks: dict[int, str] = {}  # id(ddp) -> the comm hook ddptop set on it
        self._autocast_checked = False

    def ddp_kwargs(self, init: Any, ddp: Any, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """The script's DDP() arguments with the run's knobs put in; what it asked for and
        what changed are kept for the facts sent once DDP exists."""
        script = self.script
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
        if "static_graph" in changes and script.values["static_graph"]:
            # set at the first forward that syncs (settle): DDP made static from its
            # constructor asserts when the script's first backward runs under no_sync()
            bound.arguments["static_graph"] = asked["static_graph"]
            ddp._ddptop_static_later = True
        if script.values.get("static_graph") and "static_graph" in changes and asked.get("find_unused_parameters"):
            self.note("static_graph=True set by ddptop on a DDP built with find_unused_parameters=True: if the "
                      "parameters used change between iterations DDP stops with an error; then run without static")
        ddp._ddptop_asked = asked
        ddp._ddptop_changes = changes
        return tuple(bound.args[1:]), dict(bound.kwargs)

    def settle(self, ddp: Any) -> tuple[Any, Any] | None:
        """The script's DDP is built: static_graph, when the run sets it, goes in at the
        first forward whose gradients DDP will sync; returns the comm hook to set (comm_hook)."""
        if getattr(ddp, "_ddptop_static_later", False):
            self._static_at_first_sync(ddp)
        return self.comm_hook(ddp)

    def _static_at_first_sync(self, ddp: Any) -> None:
        """DDP._set_static_graph() before the first forward outside no_sync() (DDP counts
        only those as iterations, so it is still "before the training loop" for DDP): a
        script that accumulates gradients under no_sync() from its first step (HF Trainer,
        Lightning) runs static too, where static_graph=True in DDP() fails its first backward
        (reducer's expect_autograd_hooks_ assert)."""
        torch = self.torch

        def before_forward(module: Any, _args: Any) -> None:
            if not (torch.is_grad_enabled() and module.require_backward_grad_sync):
                return
            handle.remove()
            if not module.static_graph:
                module._set_static_graph()
            self.send_facts({"static_graph": bool(module.static_graph)})  # in effect from now

        handle = ddp.register_forward_pre_hook(before_forward)

    def comm_hook(self, ddp: Any) -> tuple[Any, Any] | None:
        """(state, hook) for the comm hook the run sets on the script's DDP, or None."""
        script = self.script
        if "comm_hook" not in script.apply or script.values.get("comm_hook", "none") == "none":
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

    def script_hook_wins(self, ddp: Any, hook: Any) -> None:
        """The script registers its own comm hook: it is kept, and the one the run asked
        for is not applied (never a silent no-op, never a lossy hook the script did not ask for)."""
        script = self.script
        if "comm_hook" not in script.apply:
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
            self.send_ddp_facts(ddp)

    def send_ddp_facts(self, ddp: Any) -> None:
        """What the script asked of DDP and what ddptop set on it."""
        asked = getattr(ddp, "_ddptop_asked", None)
        changes = getattr(ddp, "_ddptop_changes", {})
        facts: dict[str, Any] = {"ddp_set": ", ".join(f"{k} {v}" for k, v in changes.items()) or "nothing (as is)"}
        if asked:
            facts["ddp_asked"] = ", ".join(f"{k}={_show(v)}" for k, v in asked.items() if k in DDP_ARGS[:3])
        self.send_facts(facts)

    def first_forward(self, cuda: bool) -> None:
        """The DDP module's first forward: its autocast is checked once."""
        if not self._autocast_checked:
            self._autocast_checked = True
            self.check_autocast(cuda)

    def check_autocast(self, cuda: bool) -> None:
        """The script's own autocast at its first forward, against what the run asked for:
        ddptop does not change a script's compute precision, so a mismatch is said."""
        torch = self.torch
        device = "cuda" if cuda else "cpu"
        try:
            enabled = bool(torch.is_autocast_enabled(device))
            dtype = torch.get_autocast_dtype(device) if enabled else None
        except (TypeError, AttributeError):  # torch before 2.4
            enabled = bool(torch.is_autocast_enabled() if device == "cuda" else torch.is_autocast_cpu_enabled())
            dtype = None
        names = {torch.bfloat16: "bf16", torch.float16: "fp16"}
        seen = "none" if not enabled else names.get(dtype, str(dtype).removeprefix("torch.") if dtype else "on")
        self.send_facts({"autocast": seen})
        if "autocast" not in self.script.apply:
            return
        asked = self.script.values.get("autocast", "none")
        if asked != seen:
            self.note(f"autocast={asked} asked, but the script's forward runs with autocast {seen}: ddptop does "
                      "not change a script's compute precision (use torch.autocast in the script)")


def blame_settings(exc: Any, ddps: list[Any], note: Callable[[str], None]) -> None:
    """A crash that a setting ddptop applied caused says so (static_graph on a graph that
    changes between iterations is DDP's RuntimeError at the second backward)."""
    text = str(exc)
    set_static = any("static_graph" in getattr(d, "_ddptop_changes", {}) for d in ddps)
    if set_static and ("static_graph" in text or "graph has changed" in text):
        note("static_graph=True, set by ddptop, does not fit this script: its graph changes between "
             "iterations (run it without static_graph)")


@functools.lru_cache(maxsize=8)
def _signature(fn: Any) -> inspect.Signature:
    return inspect.signature(fn)


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
