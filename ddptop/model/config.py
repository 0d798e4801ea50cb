"""RunConfig (every knob of a run) and the preset table.

Pure data and validation: no I/O, no torch, no UI. The CLI, the TUI's settings
screen and the trainer all go through `RunConfig` and `ConfigError`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field, fields
from typing import Any

MODELS = ("auto", "vit_l_32", "vit_b_32", "vit_b_16", "tiny_vit")
BACKENDS = ("auto", "nccl", "gloo")
COMM_HOOKS = ("none", "fp16", "bf16", "powersgd")
AUTOCAST = ("none", "bf16", "fp16")
DATA = ("loader", "device")  # loader: DataLoader workers (the article); device: random batches made on the device
CHOICES: dict[str, tuple[str, ...]] = {
    "model": MODELS,
    "backend": BACKENDS,
    "comm_hook": COMM_HOOKS,
    "autocast": AUTOCAST,
    "data": DATA,
}


# The knobs a preset owns; everything else (nproc, steps, model...) is the run's.
DDP_KNOBS = (
    "ddp", "static_graph", "gradient_as_bucket_view", "bucket_cap_mb", "comm_hook",
    "powersgd_rank", "powersgd_start_iter", "autocast",
)


# The DDP knobs ddptop can apply to a user's own script where it constructs DDP (`ddp`, one
# process without DDP, cannot be imposed on a script that builds its own DDP).
SCRIPT_KNOBS = tuple(k for k in DDP_KNOBS if k != "ddp")


# What applies to a user's own script: ranks, warmup, comm timing, the ranks' NCCL environment,
# its stop, the DDP knobs applied to its DDP (their values are added by script_dict).
SCRIPT_FIELDS = ("preset", "script", "nproc", "warmup", "script_steps", "backend", "comm_timing",
                 "comm_timing_every", "nccl_timing", "gloo_timing", "nccl_env", "ddp_apply", "cost_ab", "cost_ab_arms",
                 "cost_ab_blocks", "cost_ab_busy_pct", "cost_ab_parts", "capture_memory", "phase_every")


# What `nccl_env` may set in the ranks' environment: communication and device settings, never
# what makes a process load code or write where it is told (LD_PRELOAD, PYTHONPATH, NCCL's plugins,
# CUDA_INJECTION64_PATH, debug files): a setting is also what a viewer of the run can change.
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "GLOO_", "CUDA_")
ENV_DENIED = ("PLUGIN", "INJECTION", "PRELOAD", "LIBRARY", "PATH", "FILE", "DIR")


def env_allowed(name: str) -> bool:
    return name.startswith(ENV_PREFIXES) and not any(word in name for word in ENV_DENIED)


class ConfigError(ValueError):
    """A config value a user gave is wrong; the message is one line, fit for a CLI error."""


@dataclass(frozen=True)
class RunConfig:
    """Every knob of one run. Field docs double as help text in the CLI and TUI."""

    preset: str = "baseline"
    nproc: int = 2
    model: str = "auto"  # auto: vit_l_32 on GPU, tiny_vit on CPU
    batch_size: int = 32  # per rank
    steps: int = 200
    # the demo in a terminal (the TUI, no --steps) trains until stopped (x, q): a newcomer's
    # run was over in ~10 s, before a key was found (issue 46); `steps` then bounds nothing
    until_stopped: bool = False
    warmup: int = 5  # steps excluded from throughput and percentiles
    seed: int = 0
    backend: str = "auto"  # auto: nccl when CUDA is available, else gloo
    ddp: bool = True  # False: one process, no DDP (the per-GPU ceiling)
    static_graph: bool = False
    gradient_as_bucket_view: bool = False
    bucket_cap_mb: float = 25.0
    comm_hook: str = "none"
    powersgd_rank: int = 1  # matrix_approximation_rank
    powersgd_start_iter: int = 2  # vanilla all-reduce before this iteration
    autocast: str = "none"  # mixed-precision compute
    grad_accum: int = 1
    workers: int = 2  # DataLoader workers per rank
    data: str = "loader"  # device: like the reference recipe, no input pipeline at all
    comm_timing: bool = True  # time each bucket's all-reduce (wraps the comm hook); off: DDP's C++ path
    # On GPU, when each bucket's all-reduce completes is timed every Nth step (1: every step):
    # that CUDA event costs 1.5-3% of a ViT-L step; hand-over and exposed comm are timed every step.
    # ddptop's NCCL plugin stamps the all-reduce kernels on the same steps (on every step: +1.3%)
    comm_timing_every: int = 10
    # On NCCL: each all-reduce's own time (comm_ms, its hidden share, bus bandwidth with DDP's C++
    # all-reduce) from NCCL's own timing (TORCH_NCCL_ENABLE_TIMING and a completion hook) and, where
    # it builds (NCCL >= 2.28, cc at launch: ddptop/run/nccl_plugin.c), the kernels' own clock from
    # ddptop's NCCL profiler plugin. Off by default since 2026-11-27: TORCH_NCCL_ENABLE_TIMING alone
    # cost the ViT-L demo +1.2 ms a step [+0.7, +1.8] on 2x H200 (1.4%; off: +0.1 ms [-0.3, +0.5]),
    # against plain torchrun (docs/BENCHMARKS.md, issue 42). Off: exposed communication only.
    nccl_timing: bool = False
    # On gloo (CPU): each bucket's all-reduce timed by a Python comm hook around it (total comm,
    # its hidden share). Off by default since 2026-11-27: any Python comm hook costs a gloo step
    # ~60 us a bucket (torch's own allreduce_hook ~72; docs/BENCHMARKS.md, issue 42). Off: DDP's
    # C++ all-reduce, exposed communication only, as on a GPU without nccl_timing.
    gloo_timing: bool = False
    # torch.profiler captures also record memory (profile_memory: HTA's memory timeline);
    # the trace is larger and the profiled steps slower
    capture_memory: bool = False
    lr: float = 1e-3
    # After a stop signal (Ctrl-C, the stop key), seconds the ranks have to finish their handlers
    # (a checkpoint's save) before SIGKILL: torchrun's own default (its --shutdown-timeout)
    stop_grace: int = 30
    nccl_env: dict[str, str] = field(default_factory=dict)
    # A user's own script (`ddptop ... -- CMD`): ddptop applies to its DDP only the knobs named
    # in ddp_apply (comma-separated; empty: the script's own DDP arguments, "asis"), and stops it
    # at an agreed step after warmup + script_steps optimizer steps (0: it runs to its own end).
    script: bool = False
    ddp_apply: str = ""
    script_steps: int = 0
    # ddptop's own cost, measured in the ranks (bench/overhead_ab.py): after warmup, blocks of
    # about cost_ab seconds (shorter than a step: one step) run each arm once in a random order:
    # "on" (the rank-side layer engaged), "off" (bypassed), "aa" (bypassed again: the A/A check),
    # "busy" (bypassed plus a cost_ab_busy_pct % busy wait: the calibration); blocks go to
    # <run dir>/cost_ab/, the verdict to the summary's `cost`. 0: off.
    cost_ab: float = 0.0
    cost_ab_arms: str = "on,off,aa,busy"  # the checks by default: a verdict stands only where they pass
    cost_ab_blocks: int = 0  # the run stops after this many blocks (0: at the script's own end)
    cost_ab_busy_pct: float = 0.5
    cost_ab_parts: bool = False  # also time the hooks' parts (tracker, clock...): a diagnosis, it costs ~1.5 us a call
    phase_every: int = 0  # the rank-side layer times one step in this many (0: auto, ddptop.rank.phase_every): its cost / K
    # Fault injection for tests and demos: slow or crash one rank on purpose.
    delay_rank: int = -1
    delay_ms: float = 0.0
    fail_rank: int = -1
    fail_step: int = -1

    def with_changes(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config field(s): {', '.join(unknown)}")
        return validate(cls(**data))

    @property
    def world_size(self) -> int:
        """Ranks one node launches; a multi-node run has NodeOptions.nnodes times this."""
        return self.nproc if self.ddp else 1

    @property
    def applied(self) -> tuple[str, ...]:
        """The DDP knobs ddptop applies to a user's script, in SCRIPT_KNOBS order."""
        names = {n.strip() for n in self.ddp_apply.split(",") if n.strip()}
        return tuple(k for k in SCRIPT_KNOBS if k in names)

    def script_dict(self) -> dict[str, Any]:
        """The knobs that mean something for a user's own script (the rest, model, batch
        size, the trainer's steps..., belong to ddptop's trainer): its run fields and the
        values of the DDP knobs applied to it."""
        data = self.to_dict()
        out = {k: v for k, v in data.items() if k in SCRIPT_FIELDS}
        out.update({k: data[k] for k in self.applied})
        out["script"] = True
        return out

    def script_view(self) -> RunConfig:
        """What a user's script's run holds as its config (RunState.config): its run fields and
        the DDP knobs applied to it, the rest (the trainer's model, steps...) at their defaults."""
        return RunConfig.from_dict(self.script_dict())

    @property
    def total_steps(self) -> int:
        """The steps the run is set to take; 0 where no total is known: a run until stopped, a
        user's script (its own loop decides)."""
        return 0 if self.until_stopped or self.script else self.steps

    def describe(self) -> str:
        """Short human summary of the DDP knobs, for tables. For a user's script, the knobs
        ddptop sets (the script's own arguments are read back from its DDP, not known here)."""
        if self.script:
            return self._describe_applied() + self._describe_env()
        if not self.ddp:
            return "no DDP" + self._describe_env()
        parts = [f"bucket {self.bucket_cap_mb:g}MB"]
        if self.static_graph:
            parts.append("static")
        if self.gradient_as_bucket_view:
            parts.append("view")
        if self.comm_hook != "none":
            hook = self.comm_hook
            if hook == "powersgd":
                hook += f"(r{self.powersgd_rank},start {self.powersgd_start_iter})"
            parts.append(hook)
        if self.autocast != "none":
            parts.append(f"autocast {self.autocast}")
        if self.grad_accum > 1:
            parts.append(f"accum {self.grad_accum}")
        return ", ".join(parts) + self._describe_env()

    def _describe_env(self) -> str:
        """What else a run changed that makes it not its preset: the ranks' environment and
        how communication was timed (a runs table row must not pass for plain `baseline`)."""
        parts = [f"{k}={v}" for k, v in sorted(self.nccl_env.items())]
        if self.nccl_timing:
            parts.append("nccl_timing")
        if self.gloo_timing:
            parts.append("gloo_timing")
        if not self.comm_timing:
            parts.append("no comm timing")
        return "; " + " ".join(parts) if parts else ""

    def _describe_applied(self) -> str:
        applied = self.applied
        if not applied:
            return "as in the script"
        parts = []
        if "bucket_cap_mb" in applied:
            parts.append(f"bucket {self.bucket_cap_mb:g}MB")
        for knob, word in (("static_graph", "static"), ("gradient_as_bucket_view", "view")):
            if knob in applied:
                parts.append(word if getattr(self, knob) else f"no {word}")
        if "comm_hook" in applied:
            hook = self.comm_hook
            if hook == "powersgd":
                hook += f"(r{self.powersgd_rank},start {self.powersgd_start_iter})"
            parts.append(f"hook {hook}")
        if "autocast" in applied:
            parts.append(f"autocast {self.autocast}")
        return "set " + ", ".join(parts) if parts else "as in the script"


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    settings: dict[str, Any]


_ASIS: dict[str, Any] = {}
_VIEW = {"static_graph": True, "gradient_as_bucket_view": True, "bucket_cap_mb": 2000.0}
_OVERLAP = {**_VIEW, "bucket_cap_mb": 100.0}

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset("single", "one process, no DDP: the per-GPU ceiling", {"ddp": False}),
        Preset("baseline", "plain DDP, one 2000 MB bucket (the article's start)", {"bucket_cap_mb": 2000.0}),
        Preset("static", "baseline + static_graph", {"bucket_cap_mb": 2000.0, "static_graph": True}),
        Preset("view", "static + gradient_as_bucket_view (no grad copies)", _VIEW),
        Preset("bf16", "view + bf16 compression hook (lossy)", {**_VIEW, "comm_hook": "bf16"}),
        Preset("fp16", "view + fp16 compression hook (lossy)", {**_VIEW, "comm_hook": "fp16"}),
        Preset(
            "powersgd",
            "view + PowerSGD rank 1, compressing from iteration 2 (lossy)",
            {**_VIEW, "comm_hook": "powersgd", "powersgd_rank": 1, "powersgd_start_iter": 2},
        ),
        Preset("overlap", "view + 100 MB buckets: all-reduce overlaps backward", _OVERLAP),
        Preset("bf16-overlap", "overlap + bf16 compression hook (lossy)", {**_OVERLAP, "comm_hook": "bf16"}),
        Preset("amp", "overlap + bf16 autocast (mixed-precision compute)", {**_OVERLAP, "autocast": "bf16"}),
        Preset("asis", "nothing set: a script's own DDP arguments (the demo: DDP's defaults)", _ASIS),
    ]
}


# Presets that mean something for a user's script: `asis` (its own DDP arguments) first; no
# `single` (its DDP cannot be taken away), no `amp` (ddptop does not change a script's compute).
SCRIPT_PRESETS = ("asis", *(p for p in PRESETS if p not in ("asis", "single", "amp")))


def preset_config(name: str, base: RunConfig | None = None) -> RunConfig:
    """The config for preset `name`: DDP knobs from the preset, run knobs (nproc,
    steps, model...) from `base`."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r} (valid: {', '.join(PRESETS)})")
    base = base or RunConfig()
    defaults = RunConfig()
    reset = {k: getattr(defaults, k) for k in DDP_KNOBS}
    settings = PRESETS[name].settings
    # what the preset sets is what it applies to a user's script; the rest stays the script's
    apply = ",".join(k for k in SCRIPT_KNOBS if k in settings)
    return validate(base.with_changes(**{**reset, **settings, "preset": name, "ddp_apply": apply}))


def parse_value(key: str, raw: str) -> tuple[str, Any]:
    """Parse one `--set key=value`. Returns (field, value); nccl_env.KEY sets one env var."""
    if key.startswith("nccl_env."):
        return "nccl_env." + key.split(".", 1)[1], raw
    types = {f.name: f for f in fields(RunConfig)}
    if key not in types or key == "nccl_env":
        valid = ", ".join(sorted(set(types) - {"nccl_env", "preset"}) + ["nccl_env.NAME"])
        raise ConfigError(f"unknown setting {key!r} (valid: {valid})")
    if key == "preset":
        raise ConfigError("set the preset with --preset, not --set")
    default = getattr(RunConfig(), key)
    try:
        if isinstance(default, bool):
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return key, True
            if low in ("0", "false", "no", "off"):
                return key, False
            raise ValueError
        if isinstance(default, int):
            return key, int(raw)
        if isinstance(default, float):
            return key, float(raw)
    except ValueError:
        kind = type(default).__name__
        raise ConfigError(f"setting {key}: {raw!r} is not a valid {kind}") from None
    return key, raw


def apply_overrides(config: RunConfig, pairs: list[str]) -> RunConfig:
    """Apply `key=value` strings (from --set) on top of `config`, then validate."""
    changes: dict[str, Any] = {}
    env = dict(config.nccl_env)
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"--set expects key=value, got {pair!r}")
        key, raw = pair.split("=", 1)
        name, value = parse_value(key.strip(), raw)
        if name.startswith("nccl_env."):
            env[name.split(".", 1)[1]] = value
        else:
            changes[name] = value
        if name in SCRIPT_KNOBS:  # a knob set by hand is applied to a user's script too
            applied = changes.get("ddp_apply", config.ddp_apply)
            changes["ddp_apply"] = ",".join([*filter(None, applied.split(",")), name])
    return validate(config.with_changes(**changes, nccl_env=env))


def validate(config: RunConfig) -> RunConfig:
    """Return `config` if it is consistent, else raise ConfigError naming the field. `single`
    (ddp=False) forces one process: the per-GPU ceiling whatever nproc the rest of a sweep uses."""
    c = config
    if c.preset not in PRESETS and c.preset != "custom":
        raise ConfigError(f"unknown preset {c.preset!r} (valid: {', '.join(PRESETS)})")
    for name, allowed in CHOICES.items():
        if getattr(c, name) not in allowed:
            raise ConfigError(f"{name} must be one of {', '.join(allowed)}, got {getattr(c, name)!r}")
    checks = [
        (c.nproc >= 1, f"nproc must be at least 1, got {c.nproc}"),
        (c.nproc <= 4096, f"nproc {c.nproc} is more than ddptop supports (4096)"),
        (c.steps >= 1, f"steps must be at least 1, got {c.steps}"),
        (c.warmup >= 0, f"warmup must be 0 or more, got {c.warmup}"),
        (c.script or c.warmup < c.steps,  # a script's steps are counted after its warmup
         f"warmup ({c.warmup}) must be smaller than steps ({c.steps}); pass --warmup"),
        (c.batch_size >= 1, f"batch_size must be at least 1, got {c.batch_size}"),
        (0 <= c.stop_grace <= 3600, f"stop_grace must be 0-3600 seconds, got {c.stop_grace}"),
        (c.bucket_cap_mb > 0, f"bucket_cap_mb must be positive, got {c.bucket_cap_mb:g}"),
        (c.powersgd_rank >= 1, f"powersgd_rank must be at least 1, got {c.powersgd_rank}"),
        (c.powersgd_start_iter >= 2, "powersgd_start_iter must be at least 2 (DDP needs two plain iterations)"),
        (c.grad_accum >= 1, f"grad_accum must be at least 1, got {c.grad_accum}"),
        (c.comm_timing_every >= 1, f"comm_timing_every must be at least 1, got {c.comm_timing_every}"),
        (c.workers >= 0, f"workers must be 0 or more, got {c.workers}"),
        (c.lr > 0, f"lr must be positive, got {c.lr:g}"),
        (c.delay_ms >= 0, f"delay_ms must be 0 or more, got {c.delay_ms:g}"),
        (c.ddp or c.comm_hook == "none", "a comm hook needs DDP (preset 'single' has none)"),
        (c.script_steps >= 0, f"script_steps must be 0 or more, got {c.script_steps}"),
        (c.cost_ab >= 0 and c.cost_ab_blocks >= 0 and c.cost_ab_busy_pct >= 0,
         "cost_ab, cost_ab_blocks and cost_ab_busy_pct must be 0 or more"),
        (c.phase_every >= 0 and (c.phase_every <= 1 or c.cost_ab == 0), "phase_every must be 0 (auto) or more, above 1 not with cost_ab"),
        (set(c.cost_ab_arms.split(",")) <= {"on", "off", "aa", "busy"} and "off" in c.cost_ab_arms.split(","),
         f"cost_ab_arms must name off and any of on, aa, busy, comma-separated, got {c.cost_ab_arms!r}"),
        (c.ddp or not c.script, "a script's own DDP cannot be taken away (ddp=false, preset 'single'); "
                                "run it with --nproc 1 for one rank"),
    ]
    for f in fields(c):
        value = getattr(c, f.name)
        if isinstance(value, float) and not (math.isfinite(value) and abs(value) <= 1e9):
            raise ConfigError(f"{f.name} must be a finite number (at most 1e9), got {value:g}")
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    for key in c.nccl_env:
        if not key or not key.replace("_", "").isalnum():
            raise ConfigError(f"nccl_env: {key!r} is not a valid environment variable name")
        if not env_allowed(key):
            raise ConfigError(f"nccl_env: {key} is not allowed: only {', '.join(p + '*' for p in ENV_PREFIXES)}, "
                              f"and none that names a {'/'.join(w.lower() for w in ENV_DENIED)}")
    names = [n.strip() for n in c.ddp_apply.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCRIPT_KNOBS]
    if unknown:
        raise ConfigError(f"ddp_apply: unknown knob(s) {', '.join(unknown)} (valid: {', '.join(SCRIPT_KNOBS)})")
    applied = ",".join(c.applied) if c.script else ""  # ddptop's trainer applies every knob itself
    if c.ddp_apply != applied:
        c = c.with_changes(ddp_apply=applied)
    if not c.ddp and c.nproc != 1:
        return c.with_changes(nproc=1)
    return c
