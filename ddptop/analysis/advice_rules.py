"""The advisor's rules: which path the ranks' gradients take (the slowest pair decides),
whether an NCCL env override keeps them off NVLink, and the remedy for a path at a measured
comm share. Pure: plain values in, an Advice out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from ddptop.analysis.advice import (
    CONFIDENCE,
    HIGH,
    LADDER,
    LOSSY_CAVEAT,
    MODERATE,
    PATH_TEXT,
    SLOW,
    VERY_HIGH,
    Advice,
    is_lossy,
    predicted_prefix,
)
from ddptop.analysis.nccl import CLASS_ORDER
from ddptop.model.config import DDP_KNOBS, PRESETS, RunConfig


def ordered(classes: Iterable[str]) -> list[str]:
    return sorted(classes, key=lambda c: CLASS_ORDER.index(c) if c in CLASS_ORDER else 99)


def slowest_path(transports: set[str] | None, hw: set[str] | None) -> str | None:
    """The slowest path any rank pair uses (a ring is as fast as its slowest hop)."""
    if not transports:
        return None
    path = ordered(transports)[-1]
    if path == "p2p" and hw:
        if hw == {"nvlink"}:
            return "nvlink"
        if "nvlink" not in hw:
            return "pcie-p2p"
    return path


# Env vars that keep NCCL off NVLink, and what they do, in the order to suspect them.
SUSPECTS = {
    "NCCL_P2P_DISABLE": "turns off P2P, so NVLink is never used",
    "NCCL_P2P_LEVEL": "caps the topology distance P2P may span",
    "NCCL_TOPO_FILE": "replaces the detected topology",
    "NCCL_SHM_DISABLE": "turns off shared memory",
}


def _truthy(value: str) -> bool:
    return value.strip().lower() not in ("", "0", "false", "no", "off")


def p2p_off(env: Mapping[str, str]) -> str:
    """The variable that keeps NCCL off P2P (so off NVLink) altogether; "" where none does."""
    if _truthy(env.get("NCCL_P2P_DISABLE", "")):
        return "NCCL_P2P_DISABLE"
    if env.get("NCCL_P2P_LEVEL", "").strip().upper() in ("LOC", "0"):
        return "NCCL_P2P_LEVEL"  # LOC: P2P nowhere, NVLink included
    return ""


def nvlink_unused(path: str, hw: set[str] | None, env: Mapping[str, str]) -> str:
    """A warning when the GPUs have NVLink but NCCL moves gradients another way."""
    if hw != {"nvlink"} or path not in SLOW:  # partial NVLink meshes may ring over PCIe
        return ""
    head = f"The GPUs have NVLink but NCCL sends over {PATH_TEXT[path]}:"
    culprit = p2p_off(env) or ("NCCL_TOPO_FILE" if env.get("NCCL_TOPO_FILE") else "")
    if culprit:
        return f"{head} {culprit}={env[culprit]} {SUSPECTS[culprit]}; unset it."
    return (
        f"{head} no NCCL env override found (NCCL_P2P_DISABLE, NCCL_P2P_LEVEL, NCCL_TOPO_FILE); "
        "check that every rank sees the other GPUs (CUDA_VISIBLE_DEVICES, container IPC)."
    )


def fast_path(
    config: Mapping[str, Any], path: str, share: float | None, evidence: list[str]
) -> Advice:
    changes = _changes(config, "overlap")
    said = f"ranks talk over {PATH_TEXT[path]}"
    if share is not None:
        said += f" and all-reduce is {share:.0%} of the step"
        if share < MODERATE:  # as on a slow path: the most any setting could gain is this share
            return _nothing(config, said, evidence)
    if not changes:
        return Advice("overlap", {}, f"{said}: already on the overlap settings; nothing to change.",
                      evidence=evidence, confidence="medium", reading=said)
    why = (
        "at this share it is not worth its loss"
        if path == "p2p"
        else "it costs more than it saves on a fast link"
    )
    reason = (
        f"{said}: no compression ({why}); use 100 MB buckets so all-reduce overlaps backward, "
        "with static_graph and gradient_as_bucket_view."
    )
    if config.get("comm_hook", "none") != "none":
        reason += f" Drop the {config['comm_hook']} hook."
    return Advice("overlap", changes, reason, evidence=evidence, confidence="low", reading=said)


def slow_path(
    config: Mapping[str, Any],
    path: str,
    share: float | None,
    exposed: float | None,
    evidence: list[str],
) -> Advice:
    said = f"ranks talk over {PATH_TEXT[path]}"
    if share is None:
        preset = _at_least(config, "bf16-overlap")
        return _remedy(config, preset, f"{said} (all-reduce share not measured yet)", evidence,
                       "warn", "low")
    return by_share(config, f"{said} and all-reduce is", share, exposed, evidence, strongest="powersgd")


def by_share_only(
    config: Mapping[str, Any],
    share: float | None,
    exposed: float | None,
    backend: str | None,
    evidence: list[str],
) -> Advice:
    if backend == "gloo":
        unknown = "transports are unknown on gloo"
    elif not backend:
        unknown = "the backend is not known (no rank reported a process group)"
    else:
        unknown = "NCCL transports are not known (no NCCL_DEBUG log parsed)"
    evidence = [*evidence, unknown]
    if share is None:
        return Advice(
            None,
            {},
            f"{unknown} and all-reduce time was not measured: nothing to go on; "
            "compare presets with `ddptop sweep`.",
            evidence=evidence,
            reading=unknown,
        )
    # Not knowing the path, never advise the hardest compression: bf16-overlap at most.
    return by_share(config, f"{unknown}; all-reduce is", share, exposed, evidence, strongest="bf16-overlap")


# The remedy ladder for a measured comm share, strongest first: (share at least, preset,
# severity, confidence). A rule may stop below the top rung (`strongest`).
RUNGS = (
    (VERY_HIGH, "powersgd", "warn", "high"),
    (HIGH, "bf16-overlap", "warn", "medium"),
    (MODERATE, "overlap", "info", "low"),
)


def by_share(config: Mapping[str, Any], said: str, share: float, exposed: float | None,
             evidence: list[str], strongest: str) -> Advice:
    """The one comm-share ladder: the remedy of the highest rung `share` reaches, from
    `strongest` down (a share at a higher rung gets `strongest`); nothing below MODERATE."""
    said += f" {share:.0%} of the step"
    if exposed is not None and share - exposed >= 0.05:
        said += f" ({exposed:.0%} exposed)"
    top = [preset for _, preset, _, _ in RUNGS].index(strongest)
    for i, (floor, preset, severity, confidence) in enumerate(RUNGS):
        if i >= top and share >= floor:
            return _remedy(config, _at_least(config, preset), said, evidence, severity, confidence)
    return _nothing(config, said, evidence)


def _nothing(config: Mapping[str, Any], said: str, evidence: list[str]) -> Advice:
    if config.get("comm_hook", "none") != "none":
        # the small share may be the hook's doing: do not advise dropping it here
        return Advice(
            None,
            {},
            f"{said}: the {config['comm_hook']} hook keeps communication small; "
            f"keep it ({LOSSY_CAVEAT}).",
            evidence=evidence,
            lossy=True,
            confidence="medium",
            reading=said,
        )
    return Advice(None, {}, f"{said}: DDP costs little here; nothing worth tuning.",
                  evidence=evidence, confidence="high", reading=said)


def as_prediction(advice: Advice, bound_share: float | None, sweep: str) -> Advice:
    """A rule's advice as the prediction it is: its reason starts with the label, says the
    most any DDP setting can gain (removing all of the exposed all-reduce) and how to measure
    it (`sweep`: the presets to compare). Advice without a confidence is returned as it is."""
    if not advice.confidence:
        return advice
    reason = f"{predicted_prefix(advice.confidence)}: {advice.reason}"
    if advice.changes and bound_share is not None and 0 < bound_share < 1:
        reason += (f" At most {1 / (1 - bound_share):.2f}x faster: removing all of the exposed "
                   f"all-reduce ({bound_share:.0%} of the step) is the most any DDP setting can do.")
    if advice.changes:
        reason += f" {advice.confidence.capitalize()} confidence: {CONFIDENCE[advice.confidence]}"
        reason += f"; `ddptop sweep --presets {sweep}` measures it."
    return replace(advice, reason=reason)


def _at_least(config: Mapping[str, Any], preset: str) -> str:
    """`preset`, or the stronger remedy the run already uses."""
    hook = config.get("comm_hook", "none")
    current = {"powersgd": "powersgd", "bf16": "bf16-overlap", "fp16": "bf16-overlap"}.get(hook)
    if current is None:
        return preset
    return max(preset, current, key=LADDER.index)


_WHAT = {
    "overlap": "use 100 MB buckets so all-reduce overlaps backward, with static_graph and "
    "gradient_as_bucket_view",
    "bf16-overlap": "compress gradients (bf16 hook; lossy, so check accuracy) and use 100 MB "
    "buckets so all-reduce overlaps backward",
    "powersgd": "compress gradients hard (PowerSGD rank 1 from iteration 2; lossy, so check "
    "accuracy), or milder with bf16-overlap",
}


def _remedy(
    config: Mapping[str, Any], preset: str, said: str, evidence: list[str], severity: str,
    confidence: str,
) -> Advice:
    changes = _changes(config, preset)
    lossy = is_lossy(preset)
    if not changes:
        caveat = f"; {LOSSY_CAVEAT}" if lossy else ""
        reason = f"{said}: keep the {preset} settings you have{caveat}."
    else:  # _WHAT carries the lossy caveat inline
        reason = f"{said}: {_WHAT[preset]}."
    return Advice(preset, changes, reason, severity, evidence, lossy,
                  confidence=confidence if changes else "medium", reading=said)


def _changes(config: Mapping[str, Any], preset: str) -> dict[str, Any]:
    """The DDP knobs that differ between `config` and `preset`. Autocast stays the user's
    unless the preset sets it; PowerSGD parameters matter only with PowerSGD."""
    defaults = RunConfig()
    settings = PRESETS[preset].settings
    target = {k: getattr(defaults, k) for k in DDP_KNOBS} | settings
    if "autocast" not in settings:
        target.pop("autocast")
    if target.get("comm_hook") != "powersgd":
        target.pop("powersgd_rank")
        target.pop("powersgd_start_iter")
    return {k: v for k, v in target.items() if config.get(k, getattr(defaults, k)) != v}
