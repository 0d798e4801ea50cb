"""`ddptop tune`'s search space and search order, as pure functions: the tuned knobs and
their values, a configuration as a point, its neighbours one knob away (best guesses first),
the preset nearest to a point, a trial (a point run), the advisor's presets to run first,
and `Tuner`, the best-first queue over neighbours. Pure.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ddptop.analysis.advisor import LADDER, Advice
from ddptop.commands.sweep_table import rank_info
from ddptop.model.config import PRESETS, RunConfig, validate

# The knobs the tuner searches, and the values it tries. Order matters: it is the order in
# which a knob's values are neighbours of each other (bucket sizes) and the table's order.
TUNE_KNOBS = (
    "comm_hook",
    "powersgd_rank",
    "bucket_cap_mb",
    "static_graph",
    "gradient_as_bucket_view",
)
HOOKS = ("none", "bf16", "fp16", "powersgd")
POWERSGD_RANKS = (1, 2, 4)
BUCKETS_MB = (25.0, 50.0, 100.0, 200.0, 2000.0)
# Presets the tuner can start from or name in its command line: DDP settings only (not
# `single`, no DDP; not `amp`, whose autocast changes the compute, not the communication).
TUNE_PRESETS = tuple(p for p in PRESETS if p not in ("single", "amp", "asis"))

Point = dict[str, Any]  # one value per TUNE_KNOBS


def normalize(point: Mapping[str, Any]) -> Point:
    """The point with knobs that do nothing reset (PowerSGD rank without PowerSGD), so
    equal behaviour means equal points."""
    out = {k: point[k] for k in TUNE_KNOBS}
    out["bucket_cap_mb"] = float(out["bucket_cap_mb"])
    if out["comm_hook"] != "powersgd":
        out["powersgd_rank"] = RunConfig().powersgd_rank
    return out


def point_of(config: RunConfig) -> Point:
    return normalize({k: getattr(config, k) for k in TUNE_KNOBS})


def point_key(point: Mapping[str, Any]) -> tuple[Any, ...]:
    p = normalize(point)
    return tuple(p[k] for k in TUNE_KNOBS)


def preset_point(name: str) -> Point:
    defaults = RunConfig()
    settings = PRESETS[name].settings
    return normalize({k: settings.get(k, getattr(defaults, k)) for k in TUNE_KNOBS})


def _adjacent(values: Sequence[float], current: float) -> list[float]:
    """The values next to `current` in `values` (the two nearest when it is not there)."""
    if current in values:
        i = values.index(current)
        return [values[j] for j in (i - 1, i + 1) if 0 <= j < len(values)]
    below = [v for v in values if v < current]
    above = [v for v in values if v > current]
    return ([below[-1]] if below else []) + ([above[0]] if above else [])


@dataclass(frozen=True)
class Move:
    """One neighbour: the point, the knob changed (`from` -> `to`), and a prior (lower is
    tried first among neighbours of the same configuration)."""

    point: dict[str, Any]
    knob: str
    old: Any
    new: Any
    prior: int

    def describe(self) -> str:
        return f"{self.knob} {show_value(self.old)}->{show_value(self.new)}"


def show_value(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def neighbours(
    point: Mapping[str, Any], fixed: Iterable[str] = (), compress_first: bool = False
) -> list[Move]:
    """Every configuration one knob away from `point`, best guesses first. Knobs in `fixed`
    (the user set them with --set) never change. `compress_first`: the advisor says the
    run is communication-bound, so hooks come before buckets."""
    fixed = set(fixed)
    p = normalize(point)
    moves: list[Move] = []

    def add(knob: str, new: Any, prior: int, **also: Any) -> None:
        q = normalize({**p, knob: new, **also})
        if point_key(q) != point_key(p):
            moves.append(Move(q, knob, p[knob], new, prior))

    hook_prior, bucket_prior = (0, 1) if compress_first else (1, 0)
    if "comm_hook" not in fixed:
        for hook in HOOKS:
            if hook != p["comm_hook"]:
                add("comm_hook", hook, hook_prior + (2 if hook == "fp16" else 0))
    if p["comm_hook"] == "powersgd" and "powersgd_rank" not in fixed:
        for rank in _adjacent(POWERSGD_RANKS, p["powersgd_rank"]):
            add("powersgd_rank", int(rank), hook_prior)
    if "bucket_cap_mb" not in fixed:
        for mb in _adjacent(BUCKETS_MB, p["bucket_cap_mb"]):
            add("bucket_cap_mb", mb, bucket_prior)
    for knob in ("static_graph", "gradient_as_bucket_view"):
        if knob not in fixed:
            add(knob, not p[knob], 0 if not p[knob] else 3)  # turning them off rarely helps
    return sorted(moves, key=lambda m: m.prior)


def nearest_preset(
    point: Mapping[str, Any], presets: Sequence[str] = TUNE_PRESETS
) -> tuple[str, dict[str, Any]]:
    """The preset closest to `point` (fewest knobs differ; ties: the earlier preset) and the
    knobs to change on top of it."""
    p = normalize(point)
    best: tuple[str, dict[str, Any]] | None = None
    for name in presets:
        q = preset_point(name)
        diff = {k: p[k] for k in TUNE_KNOBS if p[k] != q[k]}
        if best is None or len(diff) < len(best[1]):
            best = (name, diff)
    assert best is not None
    return best


def preset_name(point: Mapping[str, Any]) -> str:
    """The preset this point is exactly, else "custom"."""
    key = point_key(point)
    return next((n for n in TUNE_PRESETS if point_key(preset_point(n)) == key), "custom")


def point_read_back(summary: Mapping[str, Any]) -> Point | None:
    """A script run's tuned knobs as its DDP had them (the instrument read them back after
    DDP() returned); comm_hook `none` when the script registered no compression hook."""
    info = rank_info(summary)
    if not info or not isinstance(info.get("bucket_cap_mb"), (int, float)):
        return None
    hook = str(info.get("comm_hook") or "")
    named = {"bf16_compress_hook": "bf16", "fp16_compress_hook": "fp16", "powerSGD_hook": "powersgd"}
    return normalize({
        "comm_hook": named.get(hook, "none"),
        "powersgd_rank": RunConfig().powersgd_rank,
        "bucket_cap_mb": float(info["bucket_cap_mb"]),
        "static_graph": bool(info.get("static_graph")),
        "gradient_as_bucket_view": bool(info.get("gradient_as_bucket_view")),
    })


def is_lossy(point: Mapping[str, Any]) -> bool:
    return point.get("comm_hook", "none") != "none"


# ---------------------------------------------------------------------------- trials and the search order


@dataclass
class Trial:
    """One configuration tried: where it came from and what its run measured."""

    index: int
    point: dict[str, Any]
    source: str  # "baseline", "advisor: overlap", "preset powersgd", "#3 + bucket_cap_mb 100->50"
    summary: dict[str, Any] = field(default_factory=dict)
    run_dir: str = ""
    wall_s: float = 0.0
    label: str = ""  # the config's name in the table when not its preset's (asis: a script as it is)

    @property
    def rate(self) -> float | None:
        if self.summary.get("status") != "completed":
            return None
        return self.summary.get("steps_per_s") or None


def seed_sources(advice: Advice | None) -> list[tuple[str, str]]:
    """(preset, why) to run right after baseline: the advisor's pick first, then the rest of
    its ladder (overlap, bf16-overlap, powersgd), so the result is never slower than any
    preset the advisor could recommend."""
    out: list[tuple[str, str]] = []
    if advice is not None and advice.preset in TUNE_PRESETS and advice.preset != "baseline":
        out.append((advice.preset, f"advisor: {advice.preset}"))
    for name in LADDER:
        if all(name != n for n, _ in out):
            out.append((name, f"preset {name}"))
    return out


def compress_first(advice: Advice | None) -> bool:
    return advice is not None and advice.lossy


class Tuner:
    """Best-first search. Each finished trial queues its neighbours with the trial's
    steps/s as priority, so the neighbours of the fastest configuration so far go first."""

    # what a tuned point sets on a user's script's DDP: every tuned knob (a knob left out would
    # be the script's own value, and the point would not be what ran)
    SCRIPT_APPLY = (*TUNE_KNOBS, "powersgd_start_iter")

    def __init__(self, base: RunConfig, fixed: Iterable[str] = ()) -> None:
        self.base = base
        self.fixed = frozenset(fixed)
        self.seen: set[tuple[Any, ...]] = set()
        self._queue: list[tuple[float, int, int, Move, int]] = []
        self._order = itertools.count()

    def config_for(self, point: Mapping[str, Any]) -> RunConfig:
        p = normalize(point)
        for k in self.fixed:  # the user's --set wins over the search
            p[k] = getattr(self.base, k)
        extra: dict[str, Any] = {}
        if self.base.script:
            extra["ddp_apply"] = ",".join([*self.base.applied, *self.SCRIPT_APPLY])
        return validate(self.base.with_changes(**p, **extra, preset=preset_name(p)))

    def fix(self, point: Mapping[str, Any]) -> Point:
        return point_of(self.config_for(point))

    def visit(self, point: Mapping[str, Any]) -> bool:
        """Mark `point` as tried; False when it (or its equal) already was."""
        key = point_key(self.fix(point))
        if key in self.seen:
            return False
        self.seen.add(key)
        return True

    def expand(self, trial: Trial, compress: bool) -> None:
        if trial.rate is None:
            return
        for move in neighbours(trial.point, self.fixed, compress):
            if point_key(move.point) not in self.seen:
                heapq.heappush(
                    self._queue, (-trial.rate, move.prior, next(self._order), move, trial.index)
                )

    def next_move(self) -> tuple[Move, int] | None:
        while self._queue:
            _, _, _, move, parent = heapq.heappop(self._queue)
            if point_key(move.point) not in self.seen:
                return move, parent
        return None
