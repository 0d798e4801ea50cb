"""Advisor rules: transports + hardware links + measured comm share -> a preset with a reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddptop.analysis.advisor import (
    Advice,
    advise,
    advise_run,
    comm_shares,
    hw_link_classes,
    recommend_from_sweep,
    transport_classes,
)
from ddptop.analysis.nccl import NcclParser
from ddptop.hw.topology import TopologyMatrix, TopoReading
from ddptop.model.config import RunConfig, preset_config

NCCL_LOGS = Path(__file__).parents[1] / "fixtures" / "nccl"


def summary(
    preset: str = "baseline",
    share: float | None = 0.62,
    exposed: float | None = None,
    backend: str = "nccl",
    nproc: int = 4,
    **extra,
) -> dict:
    config = preset_config(preset, RunConfig(nproc=nproc)).to_dict()
    return {
        "config": config, "world_size": config["nproc"], "backend": backend, "status": "completed",
        "steps_per_s": 6.06, "step_ms_p50": 160.0, "comm_share": share,
        "exposed_comm_share": exposed, "nccl": None, "ranks": [], **extra,
    }  # fmt: skip


def topology(label: str, n: int = 4) -> TopologyMatrix:
    gpus = tuple(TopoReading(index=i, name="NVIDIA H200", pci_bus_id=None) for i in range(n))
    links = tuple(tuple("X" if i == j else label for j in range(n)) for i in range(n))
    return TopologyMatrix(gpus=gpus, links=links)


def parsed(name: str):
    return (
        NcclParser()
        .feed_lines((NCCL_LOGS / name).read_text(errors="replace").splitlines())
        .report()
    )


def test_shm_with_high_comm_share_compresses_and_overlaps():
    a = advise(summary(share=0.62, exposed=0.60), transports={"shm"})
    assert a.preset == "bf16-overlap" and a.severity == "warn" and a.lossy
    assert a.changes == {
        "static_graph": True,
        "gradient_as_bucket_view": True,
        "bucket_cap_mb": 100.0,
        "comm_hook": "bf16",
    }
    assert "SHM (through host memory)" in a.reason and "62%" in a.reason
    assert "lossy" in a.reason and "100 MB" in a.reason
    assert "NCCL transports: shm" in a.evidence


def test_very_high_share_on_a_slow_path_goes_to_powersgd():
    a = advise(summary(share=0.84), transports={"net"})
    assert a.preset == "powersgd" and a.lossy and "lossy" in a.reason
    assert a.changes == {
        "static_graph": True,
        "gradient_as_bucket_view": True,
        "comm_hook": "powersgd",
    }


def test_nvlink_overlaps_without_compression():
    a = advise(summary(share=0.3), transports={"nvlink"})
    assert a.preset == "overlap" and not a.lossy and a.severity == "info"
    assert a.changes == {
        "static_graph": True,
        "gradient_as_bucket_view": True,
        "bucket_cap_mb": 100.0,
    }
    assert "no compression" in a.reason


def test_p2p_on_nvlink_hardware_is_nvlink_and_a_hook_is_dropped():
    a = advise(summary("bf16", share=0.2), transports={"p2p"}, hw_links={"nvlink"})
    assert a.preset == "overlap"
    assert a.changes == {"bucket_cap_mb": 100.0, "comm_hook": "none"}
    assert "NVLink" in a.reason and "Drop the bf16 hook" in a.reason


def test_p2p_on_pcie_hardware_is_a_slow_path():
    a = advise(summary(share=0.4), transports={"p2p"}, hw_links={"pcie-host"})
    assert a.preset == "bf16-overlap" and "P2P over PCIe" in a.reason


def test_nvlink_hardware_but_shm_names_the_env_var():
    a = advise(
        summary(share=0.45), transports={"shm"}, hw_links={"nvlink"}, env={"NCCL_P2P_DISABLE": "1"}
    )
    assert a.severity == "warn"
    assert "NVLink" in a.reason and "NCCL_P2P_DISABLE=1" in a.reason and "unset it" in a.reason
    assert a.preset == "bf16-overlap"  # meanwhile, compress on the path it has
    assert "env NCCL_P2P_DISABLE=1" in a.evidence


def test_nvlink_hardware_but_shm_without_an_override_says_where_to_look():
    a = advise(summary(share=0.45), transports={"shm"}, hw_links={"nvlink"}, env={})
    assert a.severity == "warn" and "no NCCL env override found" in a.reason
    level = advise(
        summary(share=0.45), transports={"shm"}, hw_links={"nvlink"}, env={"NCCL_P2P_LEVEL": "LOC"}
    )
    assert "NCCL_P2P_LEVEL=LOC" in level.reason


def test_real_logs_p2p_disabled_gives_shm_and_the_env_from_nccls_own_report():
    report = parsed("h200x4_p2pdisable_shm_info.log")
    assert transport_classes(report, topology("NV18")) == {"shm"}
    s = summary(share=0.5, nccl={"env": dict(report.env), "transports": {}})
    a = advise(s, transports=transport_classes(report), hw_links=hw_link_classes(topology("NV18")))
    assert a.severity == "warn" and "NCCL_P2P_DISABLE=1" in a.reason and a.lossy


def test_advise_run_from_session_objects():
    shm = advise_run(summary(share=0.5), parsed("h200x4_p2pdisable_shm_info.log"), topology("NV18"))
    assert shm.severity == "warn" and "NCCL_P2P_DISABLE=1" in shm.reason and shm.lossy
    nvl = advise_run(summary(share=0.1), parsed("h200x4_nvlink_info.log"), topology("NV18"))
    assert nvl.preset == "overlap" and not nvl.lossy and "NVLink" in nvl.reason
    gloo = advise_run(summary(share=0.5, backend="gloo"), None, None, {})
    assert "transports are unknown on gloo" in gloo.reason


def test_real_logs_nvlink_run_gives_nvlink_with_topology_and_no_compression():
    report = parsed("h200x4_nvlink_info.log")
    assert transport_classes(report) == {"p2p"}
    assert transport_classes(report, topology("NV18")) == {"nvlink"}
    assert transport_classes(report, topology("PIX")) == {"pcie-p2p"}
    a = advise(summary(share=0.3), transports=transport_classes(report, topology("NV18")))
    assert a.preset == "overlap" and not a.lossy and a.severity == "info"
    # 8% of the step on NVLink: no setting can gain more than that, as on any path
    low = advise(summary(share=0.08), transports=transport_classes(report, topology("NV18")))
    assert low.preset is None and "nothing worth tuning" in low.reason and low.confidence == "high"


def test_summary_nccl_labels_are_used_when_no_transports_are_given():
    s = summary(
        share=0.5,
        nccl={"env": {"NCCL_P2P_DISABLE": "1"}, "transports": {"0->1": "SHM", "1->0": "SHM"}},
    )
    a = advise(s, hw_links={"nvlink"})
    assert a.severity == "warn" and "NCCL_P2P_DISABLE=1" in a.reason


def test_gloo_advises_from_comm_share_alone():
    a = advise(summary(share=0.45, backend="gloo"))
    assert "transports are unknown on gloo" in a.reason
    assert a.preset == "bf16-overlap" and "lossy" in a.reason
    mid = advise(summary(share=0.15, backend="gloo"))
    assert mid.preset == "overlap" and not mid.lossy
    low = advise(summary(share=0.03, backend="gloo"))
    assert low.preset is None and "nothing worth tuning" in low.reason
    unmeasured = advise(summary(share=None, backend="gloo"))
    assert unmeasured.preset is None and "not measured" in unmeasured.reason


def test_one_rank_has_nothing_to_tune():
    for s in (summary("single"), summary(nproc=1)):
        a = advise(s, transports={"shm"})
        assert a.preset is None and a.changes == {} and "one rank" in a.reason


def test_never_steps_down_from_compression_on_a_slow_path():
    a = advise(summary("bf16-overlap", share=0.15), transports={"shm"})
    assert (
        a.preset == "bf16-overlap"
        and a.changes == {}
        and "keep" in a.reason
        and "lossy" in a.reason
    )
    low = advise(summary("powersgd", share=0.05), transports={"shm"})
    assert low.preset is None and "keep it" in low.reason and "lossy" in low.reason


def test_autocast_is_left_alone():
    a = advise(summary("amp", share=0.5), transports={"shm"})
    assert "autocast" not in a.changes and a.changes == {"comm_hook": "bf16"}


def test_comm_share_falls_back_to_rank_means_over_step_p50():
    s = summary(share=None)
    s["ranks"] = [
        {"comm_ms_mean": 90.0, "exposed_comm_ms_mean": 40.0},
        {"comm_ms_mean": 110.0, "exposed_comm_ms_mean": 60.0},
    ]
    assert comm_shares(s) == pytest.approx((100.0 / 160.0, 50.0 / 160.0))
    assert comm_shares({"ranks": [{}], "step_ms_p50": 10.0}) == (None, None)


def test_hw_link_classes():
    assert hw_link_classes(topology("NV18")) == {"nvlink"}
    assert hw_link_classes(topology("SYS"), gpus=[0, 1]) == {"cross-numa"}
    assert hw_link_classes(TopologyMatrix(gpus=(), links=(), available=False)) is None
    assert hw_link_classes(None) is None


def test_to_dict_is_json():
    a = advise(summary(), transports={"shm"})
    d = json.loads(json.dumps(a.to_dict()))
    assert d["preset"] == a.preset and d["severity"] in ("info", "warn") and d["evidence"]
    assert isinstance(a, Advice)


def row(preset: str, rate: float | None, status: str = "completed") -> dict:
    return {"preset": preset, "steps_per_s": rate, "status": status}


def test_sweep_recommends_fastest_with_lossy_caveat_and_lossless_alternative():
    rows = [
        row("single", 12.0),
        row("baseline", 6.06),
        row("overlap", 8.76),
        row("bf16-overlap", 10.01),
        row("powersgd", 11.0, "failed"),
    ]
    a = recommend_from_sweep(rows)
    assert a.preset == "bf16-overlap" and a.lossy
    assert "1.65x baseline" in a.reason and "lossy" in a.reason
    assert "Fastest lossless: overlap (1.45x baseline)" in a.reason
    assert a.changes["comm_hook"] == "bf16"


def test_sweep_lossless_winner_and_noise():
    a = recommend_from_sweep([row("baseline", 10.87), row("view", 11.01), row("overlap", 11.36)])
    assert a.preset == "overlap" and not a.lossy and "lossy" not in a.reason
    noise = recommend_from_sweep([row("baseline", 10.0), row("bf16", 10.1)])
    assert noise.preset == "baseline" and "keep baseline" in noise.reason
    assert (
        recommend_from_sweep([row("single", 5.0), row("baseline", None, "failed")]).preset is None
    )


def test_advisor_is_pure():
    code = "import sys, ddptop.analysis.advisor; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    mods = set(out.stdout.split())
    assert not {"torch", "textual", "asyncio", "socket", "subprocess", "pynvml"} & mods


def test_exposed_share_stands_in_for_an_untimed_total_and_says_so():
    from ddptop.analysis.advisor import advise

    summary = {"world_size": 2, "backend": "nccl", "step_ms_p50": 100.0, "exposed_comm_share": 0.4,
               "config": {"preset": "baseline", "bucket_cap_mb": 2000.0}}
    advice = advise(summary, transports={"shm"})
    assert any("lower bound" in e for e in advice.evidence), advice.evidence
    assert advice.preset != "baseline" and "share not measured" not in advice.reason, advice


@pytest.mark.parametrize("phase, look", [("data", "input pipeline"), ("backward", "its GPU")])
def test_a_named_straggler_comes_before_any_communication_remedy(phase, look):
    # SHM with 62% of the step in all-reduce would get compression and overlap; but rank 1 is
    # late, so most of that is the others waiting for it
    late = {"rank": 1, "phase": phase, "excess_ms": 5.6, "text": f"rank 1 straggler: {phase} +5.6 ms/step"}
    advice = advise(summary(share=0.62, straggler=late), transports={"shm"}, hw_links={"nvlink"})
    assert advice.preset is None and advice.changes == {} and not advice.lossy
    assert advice.severity == "warn"
    assert advice.reason.startswith(f"rank 1 straggler: {phase} +5.6 ms/step: look at its")
    assert look in advice.reason
    assert "compress" not in advice.reason and "bucket" not in advice.reason
    assert f"rank 1 straggler: {phase} +5.6 ms/step" in advice.evidence
    # no straggler: the communication rules speak as before
    assert advise(summary(share=0.62, straggler=None), transports={"shm"}, hw_links={"nvlink"}).preset is not None


def test_with_a_straggler_an_unused_nvlink_is_still_said():
    late = {"rank": 1, "phase": "backward", "excess_ms": 20.2}
    advice = advise(summary(share=0.28, straggler=late), transports={"shm"}, hw_links={"nvlink"})
    assert advice.preset is None and advice.reason.startswith("rank 1 straggler: backward +20.2 ms/step")
    assert "Also: The GPUs have NVLink but NCCL sends over SHM" in advice.reason


def test_the_advice_says_the_straggler_verdicts_cost_in_its_words():
    """A sweep's `Why` read `rank 1 straggler: forward +2.2 ms/step` beside a verdict `forward,
    costs the job 2.5 ms/step`: one figure, one wording, on every screen (GPU, 2026-11-27)."""
    late = {"rank": 1, "phase": "forward", "cost_ms": 2.5, "excess_ms": 5.2,
            "text": "rank 1 straggler: forward, costs the job 2.5 ms/step (11%)"}
    advice = advise(summary(share=0.3, straggler=late), transports={"nvlink"}, hw_links={"nvlink"})
    assert advice.reason.startswith("rank 1 straggler: forward, costs the job 2.5 ms/step: look at its GPU")
    assert "+5.2" not in advice.reason and "~2.5 ms/step" in " ".join(advice.evidence)


def test_a_straggler_whose_host_is_late_is_sent_to_its_host_in_the_verdicts_words():
    """A rank whose GPU idles at each step's start waiting for its host (4x H200, session 11:
    nothing injected, its forward +3.9 ms and data +0.5): the advice says the verdict's own words
    and points at that host, not at its GPU."""
    from ddptop.model.run_summary import straggler_dict
    from tests.model.test_straggler_replay import replay

    found = straggler_dict(replay("sym1", "gpt768pin").straggler_verdict.run_straggler())
    assert found is not None and found["host_late_ms"] == pytest.approx(0.55, abs=0.1)
    advice = advise(summary(share=0.3, straggler=found), transports={"nvlink"}, hw_links={"nvlink"})
    said = found["text"].split(" (")[0]  # `rank 2 straggler: forward, its host late, costs the job 3.6 ms/step`
    assert said.startswith("rank 2 straggler: forward, its host late, costs the job")
    assert advice.reason.startswith(f"{said}: look at its host, which launches its GPU's work late")
    assert "its GPU (another process" not in advice.reason
