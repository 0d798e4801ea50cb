"""What the advisor expects of a sweep's presets before any of them runs, and how often that
came true. Before the runs all it has is the backend, the ranks, the GPUs' links (NVML) and the
NCCL environment: from those, the path NCCL is expected to take, and from that path the rules'
(ddptop.analysis.advisor.advise, with no comm share measured yet) stance: the preset they
advise is expected to beat the reference beyond noise; on NVLink, where they advise no
compression, every compressing preset is expected not to. Nothing is expected when the path
cannot be foreseen (gloo, no NVML, a partial NVLink mesh). Scored against the table with the
recommendation's own test (ddptop.analysis.sweep_advice.beats). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ddptop.analysis.advice import FAST, NOISE, PATH_TEXT, is_lossy
from ddptop.analysis.advice_rules import p2p_off, slowest_path
from ddptop.analysis.advisor import advise
from ddptop.analysis.sweep_advice import beats, measured, reference


@dataclass(frozen=True)
class Expectation:
    preset: str
    faster: bool  # expected to beat the reference beyond noise (False: expected not to)
    why: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def expected_path(backend: str, world: int, hw_links: set[str] | None, env: Mapping[str, str]) -> str | None:
    """The transport NCCL is expected to use between the ranks: shared memory with P2P off,
    NVLink when every GPU pair has it, P2P over PCIe without any; None when it cannot be
    foreseen (one rank, gloo, no NVML, a partial NVLink mesh)."""
    if backend not in ("nccl", "auto") or world < 2 or not hw_links:
        return None
    hw = {h for h in hw_links if h not in ("self", "unknown")}
    if not hw:
        return None
    if p2p_off(env):
        return "shm"
    return slowest_path({"p2p"}, hw) if hw == {"nvlink"} or "nvlink" not in hw else None


def expectations(presets: Sequence[str], ref_config: Mapping[str, Any], world: int, path: str | None,
                 hw_links: set[str] | None, env: Mapping[str, str]) -> tuple[list[Expectation], str]:
    """What the rules expect of each of `presets` against the reference (whose config is
    `ref_config`) on `path`, and in words what they rest on."""
    if path is None:
        return [], "the ranks' path cannot be foreseen (gloo, one rank, no NVML or a partial NVLink mesh)"
    summary = {"config": dict(ref_config), "world_size": world, "backend": "nccl"}
    advice = advise(summary, transports={path}, hw_links=hw_links, env=env)
    on = f"{world} ranks expected over {PATH_TEXT.get(path, path)}"
    ref = str(ref_config.get("preset") or "baseline")
    out = []
    for p in presets:
        if p == ref or p == "single":
            continue
        if p == advice.preset:
            out.append(Expectation(p, True, f"{on}: the rules advise {p} ({advice.confidence or 'no'} confidence)"))
        elif path in FAST and p != "asis" and is_lossy(p):
            out.append(Expectation(p, False, f"{on}: the rules advise no compression there (it costs more than it saves)"))
    return out, on


def score(expected: Sequence[Expectation], rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each expectation against the table: `held` True or False, None when its preset has no
    measured row; `measured` the row's speedup and verdict in words."""
    done = measured(rows)
    ref = reference(done)
    out = []
    for e in expected:
        m = next((x for x in done if x.preset == e.preset), None)
        if m is None or ref is None:
            out.append({**e.to_dict(), "held": None, "measured": "not measured"})
            continue
        won = beats(m, ref)
        said = f"{m.rate / ref.rate:.2f}x {ref.name}, " + ("faster beyond noise" if won else
                                                           "slower beyond noise" if beats(ref, m) else "within noise")
        out.append({**e.to_dict(), "held": won == e.faster, "measured": said})
    return out


def score_lines(scored: Sequence[Mapping[str, Any]]) -> list[str]:
    """The scored expectations under the table: `k of n held` first, then one line each."""
    if not scored:
        return []
    judged = [s for s in scored if s["held"] is not None]
    lines = [f"**The advisor's expectations before the sweep:** {sum(s['held'] for s in judged)} of "
             f"{len(judged)} held (faster means beyond the table's intervals and at least {NOISE:.0%})."]
    for s in scored:
        verdict = "not measured" if s["held"] is None else ("held" if s["held"] else "did not hold")
        lines.append(f"- {s['preset']}: expected {'faster' if s['faster'] else 'not faster'} ({s['why']}); "
                     f"measured {s['measured']}: {verdict}")
    return lines

