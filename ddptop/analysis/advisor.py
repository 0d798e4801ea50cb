"""Advisor: rules from how ranks talk (NCCL transports), what the hardware offers (NVML
links) and what a run measured (communication share) to a recommended preset with a reason.

Pure: dicts and sets in, an `Advice` out. No I/O, no torch, no textual, no asyncio; the
NCCL report and topology objects are only read through their attributes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ddptop.analysis.nccl import CLASS_ORDER, transport_class
from ddptop.model.config import DDP_KNOBS, PRESETS, RunConfig

# Thresholds on comm share (all-reduce time / step time). The article's PCIe box sat at 84%;
# the 4x H200 SHM path at ~45% gained most from bf16 + 100 MB buckets, and PowerSGD only
# pulls ahead when communication dwarfs compute.
MODERATE = 0.10  # below: DDP costs little, nothing worth tuning
HIGH = 0.25  # above, on a slow path: compress
VERY_HIGH = 0.75  # above, on a slow path: compress hard (PowerSGD)

# Transport classes that move gradients through host memory, PCIe or the network.
SLOW = {"shm", "net", "pcie-p2p"}
FAST = {"nvlink", "nvls"}  # collnet is in-network (across nodes): treated like net
PCIE_HW = {"pcie-switch", "pcie-host", "cross-numa"}

PATH_TEXT = {
    "nvls": "NVLink SHARP (NVLS)",
    "nvlink": "NVLink (P2P)",
    "p2p": "P2P (NVLink or PCIe: topology unknown)",
    "pcie-p2p": "P2P over PCIe",
    "collnet": "CollNet",
    "shm": "SHM (through host memory)",
    "net": "the network (NET)",
    "unknown": "an unrecognised transport",
}

# Stronger remedies last: the advisor never steps down from what a run already uses on a
# slow path, since the measured share already includes the compression's effect.
LADDER = ("overlap", "bf16-overlap", "powersgd")
LOSSY_CAVEAT = "compression hooks are lossy: check that accuracy holds"
NOISE = 0.03  # sweep differences below this are run-to-run noise


@dataclass(frozen=True)
class Advice:
    """One recommendation: a preset (or None: keep what you have), the RunConfig fields it
    changes relative to the current run, and the evidence behind it."""

    preset: str | None
    changes: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    severity: str = "info"  # info | warn
    evidence: list[str] = field(default_factory=list)
    lossy: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "preset": self.preset,
            "changes": dict(self.changes),
            "reason": self.reason,
            "severity": self.severity,
            "evidence": list(self.evidence),
            "lossy": self.lossy,
        }


# ---------------------------------------------------------------------------- measurements


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def comm_shares(summary: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """(comm share, exposed comm share) of a summary: the run-level fields when present,
    else the ranks' mean comm_ms / exposed_comm_ms over the step p50. None when unmeasured."""
    ranks = summary.get("ranks") or []
    step = summary.get("step_ms_p50")
    out: list[float | None] = []
    for key in ("comm", "exposed_comm"):
        share = summary.get(f"{key}_share")
        if share is None and step:
            ms = _mean(r.get(f"{key}_ms_mean") for r in ranks)
            share = ms / step if ms is not None else None
        out.append(share)
    return out[0], out[1]


def mean_ms(summary: Mapping[str, Any], key: str) -> float | None:
    """Mean over ranks of a per-rank `<key>_mean` field (comm_ms, exposed_comm_ms)."""
    return _mean(r.get(key + "_mean") for r in summary.get("ranks") or [])


# ---------------------------------------------------------------------------- inputs


def transport_classes(report: Any, topology: Any = None) -> set[str] | None:
    """Classes (ddptop.analysis.nccl.CLASS_ORDER) of the transports in an NcclReport; a P2P pair is
    placed on NVLink or PCIe with the topology when each rank's GPU is known. None when the
    report has no transports (gloo, or no NCCL_DEBUG log yet)."""
    if report is None or not report.transports:
        return None
    comm = report.primary
    gpu_of = {}
    if comm is not None:
        for rank, info in comm.ranks.items():
            dev = info.nvml_dev if info.nvml_dev is not None else info.cuda_dev
            if dev is not None:
                gpu_of[rank] = dev
    classes = set()
    for (a, b), t in report.transports.items():
        classes.add(transport_class(t.label, _hw_label(topology, gpu_of.get(a), gpu_of.get(b))))
    return classes


def _hw_label(topology: Any, i: int | None, j: int | None) -> str | None:
    if topology is None or not getattr(topology, "available", False) or i is None or j is None:
        return None
    links = topology.links
    if i >= len(links) or j >= len(links[i]) or i == j:
        return None
    label = links[i][j]
    return None if label in ("N/A", "X", "") else label


def hw_link_classes(topology: Any, gpus: Iterable[int] | None = None) -> set[str] | None:
    """Link classes (ddptop.hw.gpu.link_class) between the GPUs of an NVML TopologyMatrix,
    optionally only those in `gpus`. None without NVML or with fewer than two GPUs."""
    if topology is None or not getattr(topology, "available", False):
        return None
    from ddptop.hw.gpu import link_class  # pynvml stays lazy in there

    n = len(topology.links)
    use = sorted(set(gpus) & set(range(n))) if gpus is not None else list(range(n))
    classes = {link_class(topology.links[i][j]) for i in use for j in use if i != j}
    classes.discard("unknown")
    return classes or None


def advise_run(
    summary: Mapping[str, Any],
    nccl: Any = None,
    topology: Any = None,
    env: Mapping[str, str] | None = None,
) -> Advice:
    """`advise` from what a session holds: its summary, the NcclReport parsed from the run's
    NCCL logs and the NVML TopologyMatrix (either may be None), and the ranks' environment.
    The hardware links are those between the GPUs NCCL reports the ranks on."""
    gpus = None
    if nccl is not None:  # what NCCL itself says was set by the environment
        env = {**nccl.env, **(env or {})}
    comm = nccl.primary if nccl is not None else None
    if comm is not None:
        devs = {i.nvml_dev if i.nvml_dev is not None else i.cuda_dev for i in comm.ranks.values()}
        gpus = None if None in devs else devs
    return advise(summary, transport_classes(nccl, topology), hw_link_classes(topology, gpus), env)


# ---------------------------------------------------------------------------- rules


def advise(
    summary: Mapping[str, Any],
    transports: set[str] | None = None,
    hw_links: set[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> Advice:
    """Recommend a preset for the run `summary` describes (its `config`, `world_size`,
    `backend` and comm fields). `transports` are NCCL's transport classes between rank
    pairs (see transport_classes; when None, the summary's own `nccl.transports` labels are
    used), `hw_links` the NVML link classes of the GPUs in use, `env` the environment the
    ranks ran with (NCCL's own "set by environment" report is merged in)."""
    config = dict(summary.get("config") or {})
    world = summary.get("world_size") or config.get("nproc") or 1
    if config.get("ddp") is False or world <= 1:
        return Advice(
            None,
            reason="one rank: there is no gradient communication to tune.",
            evidence=[f"world size {world}"],
        )

    nccl = summary.get("nccl") or {}
    env = {**(nccl.get("env") or {}), **(env or {})}
    if transports is None and nccl.get("transports"):
        transports = {transport_class(label) for label in nccl["transports"].values()}
    transports = {t for t in transports or () if t != "unknown"} or None
    hw = {h for h in hw_links or () if h not in ("self", "unknown")} or None
    share, exposed = comm_shares(summary)

    evidence = [f"world size {world}", f"backend {summary.get('backend') or 'unknown'}"]
    if summary.get("steps_per_s") is not None:
        evidence.append(f"{summary['steps_per_s']:.2f} steps/s")
    if share is not None:
        evidence.append(f"all-reduce {share:.0%} of the step")
    if exposed is not None:
        evidence.append(f"exposed (not overlapped) all-reduce {exposed:.0%} of the step")
        if share is None:  # a GPU run without nccl_timing: what backward could not hide is a lower bound
            share = exposed
            evidence.append("all-reduce total not timed (nccl_timing off): its exposed part stands in, a lower bound")
    if transports:
        evidence.append("NCCL transports: " + ", ".join(_ordered(transports)))
    if hw:
        evidence.append("hardware links: " + ", ".join(sorted(hw)))
    evidence += [f"env {k}={v}" for k, v in sorted(env.items()) if k in _SUSPECTS]

    path = _path(transports, hw)
    if path is None:
        return _by_share_only(config, share, exposed, summary.get("backend"), evidence)
    # Across nodes the ring crosses the network whatever links the GPUs of one node have.
    spans_nodes = (summary.get("nnodes") or 1) > 1
    mismatch = "" if spans_nodes and path in ("net", "collnet") else _nvlink_unused(path, hw, env)
    if path in FAST or (path == "p2p" and (share is None or share < HIGH)):
        advice = _fast_path(config, path, share, evidence)
    else:
        advice = _slow_path(config, path, share, exposed, evidence)
    if mismatch:
        return Advice(
            advice.preset,
            advice.changes,
            f"{mismatch} Meanwhile: {advice.reason}",
            "warn",
            advice.evidence,
            advice.lossy,
        )
    return advice


def _ordered(classes: Iterable[str]) -> list[str]:
    return sorted(classes, key=lambda c: CLASS_ORDER.index(c) if c in CLASS_ORDER else 99)


def _path(transports: set[str] | None, hw: set[str] | None) -> str | None:
    """The slowest path any rank pair uses (a ring is as fast as its slowest hop)."""
    if not transports:
        return None
    path = _ordered(transports)[-1]
    if path == "p2p" and hw:
        if hw == {"nvlink"}:
            return "nvlink"
        if "nvlink" not in hw:
            return "pcie-p2p"
    return path


# Env vars that keep NCCL off NVLink, and what they do, in the order to suspect them.
_SUSPECTS = {
    "NCCL_P2P_DISABLE": "turns off P2P, so NVLink is never used",
    "NCCL_P2P_LEVEL": "caps the topology distance P2P may span",
    "NCCL_TOPO_FILE": "replaces the detected topology",
    "NCCL_SHM_DISABLE": "turns off shared memory",
}


def _truthy(value: str) -> bool:
    return value.strip().lower() not in ("", "0", "false", "no", "off")


def _nvlink_unused(path: str, hw: set[str] | None, env: Mapping[str, str]) -> str:
    """A warning when the GPUs have NVLink but NCCL moves gradients another way."""
    if hw != {"nvlink"} or path not in SLOW:  # partial NVLink meshes may ring over PCIe
        return ""
    head = f"The GPUs have NVLink but NCCL sends over {PATH_TEXT[path]}:"
    culprit = ""
    if _truthy(env.get("NCCL_P2P_DISABLE", "")):
        culprit = "NCCL_P2P_DISABLE"
    elif env.get("NCCL_P2P_LEVEL", "").strip().upper() in ("LOC", "0"):
        culprit = "NCCL_P2P_LEVEL"  # LOC: P2P nowhere, NVLink included
    elif env.get("NCCL_TOPO_FILE"):
        culprit = "NCCL_TOPO_FILE"
    if culprit:
        return f"{head} {culprit}={env[culprit]} {_SUSPECTS[culprit]}; unset it."
    return (
        f"{head} no NCCL env override found (NCCL_P2P_DISABLE, NCCL_P2P_LEVEL, NCCL_TOPO_FILE); "
        "check that every rank sees the other GPUs (CUDA_VISIBLE_DEVICES, container IPC)."
    )


def _fast_path(
    config: Mapping[str, Any], path: str, share: float | None, evidence: list[str]
) -> Advice:
    changes = _changes(config, "overlap")
    said = f"ranks talk over {PATH_TEXT[path]}"
    if share is not None:
        said += f" and all-reduce is {share:.0%} of the step"
    if not changes:
        return Advice(
            "overlap",
            {},
            f"{said}: already on the overlap settings; nothing to change.",
            evidence=evidence,
        )
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
    return Advice("overlap", changes, reason, evidence=evidence)


def _slow_path(
    config: Mapping[str, Any],
    path: str,
    share: float | None,
    exposed: float | None,
    evidence: list[str],
) -> Advice:
    said = f"ranks talk over {PATH_TEXT[path]}"
    if share is None:
        preset = _at_least(config, "bf16-overlap")
        return _remedy(
            config, preset, f"{said} (all-reduce share not measured yet)", evidence, "warn"
        )
    said += f" and all-reduce is {share:.0%} of the step"
    if exposed is not None and share - exposed >= 0.05:
        said += f" ({exposed:.0%} exposed)"
    if share >= VERY_HIGH:
        return _remedy(config, _at_least(config, "powersgd"), said, evidence, "warn")
    if share >= HIGH:
        return _remedy(config, _at_least(config, "bf16-overlap"), said, evidence, "warn")
    if share >= MODERATE:
        return _remedy(config, _at_least(config, "overlap"), said, evidence, "info")
    return _nothing(config, said, evidence)


def _by_share_only(
    config: Mapping[str, Any],
    share: float | None,
    exposed: float | None,
    backend: str | None,
    evidence: list[str],
) -> Advice:
    if backend == "gloo":
        unknown = "transports are unknown on gloo"
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
        )
    said = f"{unknown}; all-reduce is {share:.0%} of the step"
    if exposed is not None and share - exposed >= 0.05:
        said += f" ({exposed:.0%} exposed)"
    if share >= HIGH:
        return _remedy(config, _at_least(config, "bf16-overlap"), said, evidence, "warn")
    if share >= MODERATE:
        return _remedy(config, _at_least(config, "overlap"), said, evidence, "info")
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
        )
    return Advice(
        None, {}, f"{said}: DDP costs little here; nothing worth tuning.", evidence=evidence
    )


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
    config: Mapping[str, Any], preset: str, said: str, evidence: list[str], severity: str
) -> Advice:
    changes = _changes(config, preset)
    lossy = _lossy(preset)
    if not changes:
        caveat = f"; {LOSSY_CAVEAT}" if lossy else ""
        reason = f"{said}: keep the {preset} settings you have{caveat}."
    else:  # _WHAT carries the lossy caveat inline
        reason = f"{said}: {_WHAT[preset]}."
    return Advice(preset, changes, reason, severity, evidence, lossy)


def _lossy(preset: str) -> bool:
    return PRESETS[preset].settings.get("comm_hook", "none") != "none"


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


# ---------------------------------------------------------------------------- sweeps


def recommend_from_sweep(rows: Sequence[Mapping[str, Any]]) -> Advice:
    """The fastest preset of a sweep. `rows` are dicts with at least `preset`, `status` and
    `steps_per_s` (ddptop.commands.sweep.build_rows makes them). `single` is the per-GPU ceiling, not
    a DDP setting, so it is never the recommendation."""
    done = [
        r
        for r in rows
        if r.get("status") == "completed"
        and r.get("steps_per_s")
        and r.get("preset") in PRESETS
        and r["preset"] != "single"
    ]
    if not done:
        return Advice(
            None,
            reason="no DDP run of the sweep completed with measurements: nothing to recommend.",
            evidence=[f"{len(rows)} run(s)"],
        )
    ref = next((r for r in done if r["preset"] == "baseline"), done[0])
    best = max(done, key=lambda r: r["steps_per_s"])
    gain = best["steps_per_s"] / ref["steps_per_s"]
    evidence = [f"{r['preset']}: {r['steps_per_s']:.2f} steps/s" for r in done]
    settings = dict(PRESETS[best["preset"]].settings)
    lossy = _lossy(best["preset"])
    if best is ref or gain < 1 + NOISE:
        close = "" if best is ref else f" (best: {best['preset']} at {gain:.2f}x, within noise)"
        reason = (
            f"no preset beats {ref['preset']} by more than {NOISE:.0%}{close}: "
            f"keep {ref['preset']}."
        )
        if _lossy(ref["preset"]):
            reason += f" It compresses gradients: {LOSSY_CAVEAT}."
        return Advice(
            ref["preset"],
            dict(PRESETS[ref["preset"]].settings),
            reason,
            evidence=evidence,
            lossy=_lossy(ref["preset"]),
        )
    rate = best["steps_per_s"]
    reason = f"{best['preset']} is fastest: {rate:.2f} steps/s, {gain:.2f}x {ref['preset']}."
    if lossy:
        reason += f" It compresses gradients: {LOSSY_CAVEAT}."
        safe = [r for r in done if not _lossy(r["preset"])]
        if safe:
            alt = max(safe, key=lambda r: r["steps_per_s"])
            reason += (
                f" Fastest lossless: {alt['preset']} "
                f"({alt['steps_per_s'] / ref['steps_per_s']:.2f}x {ref['preset']})."
            )
    return Advice(best["preset"], settings, reason, "info", evidence, lossy)
