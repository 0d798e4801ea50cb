"""Advisor: rules from how ranks talk (NCCL transports), what the hardware offers (NVML
links) and what a run measured (communication share) to a recommended preset with a reason.
The record and thresholds are ddptop.analysis.advice, the rules ddptop.analysis.advice_rules.

Pure: dicts and sets in, an `Advice` out. No I/O, no torch, no textual, no asyncio; the
NCCL report and topology objects are only read through their attributes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from ddptop.analysis.advice import (
    FAST,
    HIGH,
    LADDER,
    LOSSY_CAVEAT,
    NOISE,
    Advice,
)
from ddptop.analysis.advice_rules import (
    SUSPECTS,
    as_prediction,
    by_share_only,
    fast_path,
    nvlink_unused,
    ordered,
    slow_path,
    slowest_path,
)
from ddptop.analysis.nccl import transport_class
from ddptop.analysis.sweep_advice import explain, recommend_from_sweep
from ddptop.hw.topology import link_class
from ddptop.model.figures import summary_comm_shares, summary_mean_ms, timing_switch
from ddptop.model.status import RUN_LIVE
from ddptop.model.straggler_work import AFTER_FORWARD, phase_words

__all__ = ["LADDER", "LOSSY_CAVEAT", "NOISE", "Advice", "advise", "advise_run", "comm_shares", "explain",
           "hw_link_classes", "mean_ms", "recommend_from_sweep", "straggler_first", "transport_classes"]


# The comm shares the advice rests on are the summary's own (ddptop.model.figures.summary_comm_shares),
# the same function the sweep, tune and batch tables read: kept under these names for callers.
comm_shares = summary_comm_shares
mean_ms = summary_mean_ms


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
    """Link classes (ddptop.hw.topology.link_class) between the GPUs of an NVML TopologyMatrix,
    optionally only those in `gpus`. None without NVML or with fewer than two GPUs."""
    if topology is None or not getattr(topology, "available", False):
        return None
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
            basis="measured",
        )

    ranks = summary.get("ranks") or []
    ended = summary.get("status") is not None and summary["status"] not in RUN_LIVE
    if ended and summary.get("step_ms_p50") is None and ranks and all(r.get("steps") == 0 for r in ranks):
        return Advice(None, reason="no step was measured (the notes say why): nothing to advise.",
                      evidence=["0 steps measured on every rank"], basis="measured")
    nccl = summary.get("nccl") or {}
    env = {**(nccl.get("env") or {}), **(env or {})}
    if transports is None and nccl.get("transports"):
        transports = {transport_class(label) for label in nccl["transports"].values()}
    transports = {t for t in transports or () if t != "unknown"} or None
    hw = {h for h in hw_links or () if h not in ("self", "unknown")} or None
    share, exposed = comm_shares(summary)
    evidence, share = _evidence(summary, world, share, exposed, transports, hw, env)
    path = slowest_path(transports, hw)
    # Across nodes the ring crosses the network whatever links the GPUs of one node have.
    spans_nodes = (summary.get("nnodes") or 1) > 1
    mismatch = "" if path is None or (spans_nodes and path in ("net", "collnet")) else nvlink_unused(path, hw, env)
    late = straggler_first(summary.get("straggler"), evidence, mismatch, summary.get("step_ms_p50"))
    if late is not None:
        return late
    if path is None:
        advice = by_share_only(config, share, exposed, summary.get("backend"), evidence)
    elif path in FAST or (path == "p2p" and (share is None or share < HIGH)):
        advice = fast_path(config, path, share, evidence)
    else:
        advice = slow_path(config, path, share, exposed, evidence)
    ref = "asis" if config.get("script") else "baseline"
    advice = as_prediction(advice, exposed if exposed is not None else share, f"{ref},{advice.preset}")
    if mismatch:
        return replace(advice, reason=f"{mismatch} Meanwhile: {advice.reason}", severity="warn",
                       warning=mismatch)
    return advice


# What a straggler's slow phase usually comes from, and where to look first.
STRAGGLER_LOOK = {
    "data": "its input pipeline (DataLoader workers, storage, CPU contention on its host)",
    "forward": "its GPU (another process on it, clocks or temperature) or host-side work before its forward",
    "backward": "its GPU (another process on it, clocks or temperature)",
    "optimizer": "its optimizer step (host-side work, a sync in it)",
    AFTER_FORWARD: ("what its script runs between the forward's return and backward (a loader called there, "
                    "as nanoGPT prefetches the next batch; a sync such as loss.item())"),
}

# its phases all long on the host's side (its GPU idle at each step's start): not the model's work
HOST_LATE_LOOK = ("its host, which launches its GPU's work late: what shares its CPU cores (another process, its "
                  "own threads, a busy SMT sibling), their clocks, and host-side work in its loop")


def straggler_first(straggler: Any, evidence: list[str], mismatch: str = "",
                    step_ms: float | None = None) -> Advice | None:
    """A named straggler comes before any communication remedy: the other ranks' all-reduce
    time is largely waiting for it, which no bucket size or compression shortens, so that wait
    is put down to the straggler's phase. Measured, not predicted: the reason starts with what
    to act on, in the verdict's words (`rank 1 straggler: data, costs the job 5.6 ms/step: look at its
    input pipeline ...`; an older summary's excess: `data +5.6 ms/step`). A link NCCL
    leaves unused (`mismatch`) is still said: it is no remedy for waiting either."""
    if not isinstance(straggler, Mapping) or straggler.get("rank") is None:
        return None
    rank, phase = straggler["rank"], straggler.get("phase") or "own work"
    cost = straggler.get("cost_ms")  # what it costs the job, in the verdict's own words
    excess = cost if cost is not None else straggler.get("excess_ms")  # older summaries: its excess
    more = (f", costs the job {cost:.1f} ms/step" if isinstance(cost, (int, float)) else
            f" +{excess:.1f} ms/step" if isinstance(excess, (int, float)) else "")
    wait = (f"~{excess:.1f} ms/step" if isinstance(excess, (int, float)) else "much")
    if isinstance(excess, (int, float)) and step_ms:
        wait += f" ({excess / step_ms:.0%} of the step)"
    host_late = straggler.get("host_late_ms")
    said = f"rank {rank} straggler: {phase_words(phase, host_late)}{more}"
    look = HOST_LATE_LOOK if host_late else STRAGGLER_LOOK.get(phase, "that rank")
    return Advice(
        None,
        reason=(f"{said}: look at {look}. The other ranks wait for it in "
                f"the all-reduce, so that wait is rank {rank}'s {phase}, not communication: no DDP "
                "communication setting shortens it." + (f" Also: {mismatch}" if mismatch else "")),
        severity="warn",
        evidence=[*evidence, straggler.get("text") or f"straggler rank {rank}",
                  f"of the other ranks' all-reduce time, {wait} is waiting for rank {rank}'s {phase}"],
        basis="measured",
        reading=said,
        warning=mismatch,
    )


def _evidence(
    summary: Mapping[str, Any],
    world: int,
    share: float | None,
    exposed: float | None,
    transports: set[str] | None,
    hw: set[str] | None,
    env: Mapping[str, str],
) -> tuple[list[str], float | None]:
    """What the advice rests on, and the comm share to judge by: without nccl_timing the
    exposed share stands in for the total."""
    evidence = [f"world size {world}", f"backend {summary.get('backend') or 'unknown'}"]
    if summary.get("steps_per_s") is not None:
        evidence.append(f"{summary['steps_per_s']:.2f} steps/s")
    if share is not None:
        evidence.append(f"all-reduce {share:.0%} of the step")
    if exposed is not None:
        evidence.append(f"exposed (not overlapped) all-reduce {exposed:.0%} of the step")
        if share is None:  # without nccl_timing (gloo_timing): what backward could not hide is a lower bound
            share = exposed
            evidence.append(f"all-reduce total not timed ({timing_switch(summary)} off): its exposed part stands in, "
                            "a lower bound")
    if transports:
        evidence.append("NCCL transports: " + ", ".join(ordered(transports)))
    if hw:
        evidence.append("hardware links: " + ", ".join(sorted(hw)))
    evidence += [f"env {k}={v}" for k, v in sorted(env.items()) if k in SUSPECTS]
    return evidence, share
