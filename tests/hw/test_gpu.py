"""GPU layer: topology matrix from real NVML readings (NVML faked at its boundary), the
no-NVML path, and the psutil fallback."""

from __future__ import annotations

import json
import os
import re
import sys
import types
from pathlib import Path

import pytest

from ddptop.commands.topo import main_topo
from ddptop.hw import gpu, topology
from ddptop.hw.processes import ProcessStats, process_stats

FIXTURES = Path(__file__).parents[1] / "fixtures" / "gpu"
SNAPSHOT = json.loads((FIXTURES / "nvml_snapshot.json").read_text())


class NVMLError(Exception):
    def __init__(self, value: int = 999) -> None:
        super().__init__(value)
        self.value = value


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's own class names
    def __str__(self) -> str:
        return "Not Supported"


class NVMLError_InvalidArgument(NVMLError):  # noqa: N801
    pass


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801
    def __str__(self) -> str:
        return "NVML Shared Library Not Found"


def fake_pynvml(snapshot: dict) -> types.ModuleType:
    """A pynvml stand-in answering from the recorded snapshot of the 4x H200 machine. What the
    snapshot did not record raises NotSupported, as the real library does for missing values.
    CPU/NUMA affinity are not in the snapshot; they come from nvidia-smi on the same machine."""
    gpus = snapshot["gpus"]
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError
    m.NVML_P2P_CAPS_INDEX_NVLINK = 2
    m.NVML_P2P_CAPS_INDEX_READ = (0,)  # the real pynvml bug: a tuple
    m.NVML_TEMPERATURE_GPU = 0
    m.NVML_CLOCK_SM = 1
    m.NVML_PCIE_UTIL_TX_BYTES = 0
    m.NVML_PCIE_UTIL_RX_BYTES = 1
    m.calls = []

    def unsupported(*_a):
        raise NVMLError_NotSupported(3)

    def link_state(h, link):
        states = gpus[h]["nvlink_states"]
        if link >= len(states):
            raise NVMLError_InvalidArgument(2)
        return states[link]

    def p2p(h1, h2, index):
        if not isinstance(index, int):
            raise TypeError("Don't know how to convert parameter 3")
        if index != 2:
            raise NVMLError_NotSupported(3)
        return gpus[h1]["p2p_nvlink"][str(h2)]

    def pcie(h, counter):
        if counter == 0:
            return gpus[h]["pcie_tx_kbs"]
        raise NVMLError_NotSupported(3)

    words = lambda n: [2**64 - 1] + [0] * (n - 1)  # noqa: E731 - CPUs 0-63
    m.nvmlInit = lambda: m.calls.append("init")
    m.nvmlShutdown = lambda: m.calls.append("shutdown")
    m.nvmlSystemGetDriverVersion = lambda: snapshot["driver"]
    m.nvmlDeviceGetCount = lambda: len(gpus)
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda h: gpus[h]["name"]
    m.nvmlDeviceGetUUID = lambda h: gpus[h]["uuid"]
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=gpus[h]["pci_bus_id"].encode())
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=gpus[h]["util"], memory=0)
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=gpus[h]["mem_total"], used=0)
    m.nvmlDeviceGetPowerUsage = lambda h: gpus[h]["power_mw"]
    m.nvmlDeviceGetEnforcedPowerLimit = lambda h: gpus[h]["power_limit_mw"]
    m.nvmlDeviceGetTemperature = lambda h, s: gpus[h]["temp_c"]
    m.nvmlDeviceGetClockInfo = lambda h, c: gpus[h]["sm_clock"]
    m.nvmlDeviceGetPcieThroughput = pcie
    m.nvmlDeviceGetNvLinkState = link_state
    m.nvmlDeviceGetNvLinkRemotePciInfo = unsupported
    m.nvmlDeviceGetFieldValues = unsupported
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: (
        [types.SimpleNamespace(pid=4242, usedGpuMemory=2**30)] if h == 1 else []
    )
    m.nvmlDeviceGetTopologyCommonAncestor = lambda h1, h2: gpus[h1]["topo"][str(h2)]
    m.nvmlDeviceGetP2PStatus = p2p
    m.nvmlDeviceGetCpuAffinityWithinScope = lambda h, n, scope: words(n)
    m.nvmlDeviceGetMemoryAffinity = lambda h, n, scope: [1]
    m.nvmlDeviceGetNumaNodeId = unsupported
    m.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: gpus[h]["pcie_gen"]
    m.nvmlDeviceGetCurrPcieLinkWidth = lambda h: gpus[h]["pcie_width"]
    m.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: gpus[h]["pcie_gen"]
    m.nvmlDeviceGetMaxPcieLinkWidth = lambda h: gpus[h]["pcie_width"]
    return m


def first_table(text: str) -> list[list[str]]:
    """Rows of the first table of `nvidia-smi topo -m` output, as whitespace-split words."""
    rows = []
    for line in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines():
        if not line.strip():
            break
        rows.append(line.split())
    return rows


def test_topology_from_fixture_matches_nvidia_smi() -> None:
    nvml = gpu.Nvml(module=fake_pynvml(SNAPSHOT))
    matrix = nvml.topology()
    for i in range(4):
        for j in range(4):
            assert matrix.link(i, j) == ("X" if i == j else "NV18")
    expected = first_table((FIXTURES / "nvidia_smi_topo.txt").read_text())
    assert first_table(topology.render_topology(matrix)) == expected
    assert matrix.gpus[0].pcie_gen == 5 and matrix.gpus[0].pcie_width == 16


def test_nvlink_wins_over_hostbridge_ancestor() -> None:
    # The recorded ancestor for every pair is HOSTBRIDGE (30): without NVLink it would be PHB.
    snap = json.loads(json.dumps(SNAPSHOT))
    for g in snap["gpus"]:
        g["nvlink_states"] = [0] * len(g["nvlink_states"])
    matrix = gpu.Nvml(module=fake_pynvml(snap)).topology()
    assert {matrix.link(i, j) for i in range(4) for j in range(4) if i != j} == {"PHB"}


def test_direct_links_from_remote_pci_ids() -> None:
    # A DGX-1-like box: GPU0-GPU1 bonded by two links, GPU0-GPU2 by one, GPU1-GPU2 only PCIe.
    bus = ["0000:1b:00.0", "0000:1c:00.0", "0000:3d:00.0"]
    readings = [
        topology.TopoReading(0, "g", "00000000:1B:00.0", (1, 1, 1), (bus[1], bus[1], bus[2]),
                        ancestor={1: 20, 2: 50}, p2p_nvlink={1: 0, 2: 0}),
        topology.TopoReading(1, "g", bus[1], (1, 1), (bus[0], bus[0]),
                        ancestor={0: 20, 2: 50}, p2p_nvlink={0: 0, 2: 5}),
        topology.TopoReading(2, "g", bus[2], (1,), (bus[0],),
                        ancestor={0: 50, 1: 50}, p2p_nvlink={0: 0, 1: 5}),
    ]  # fmt: skip
    m = topology.topology_from_readings(readings)
    assert [list(r) for r in m.links] == [
        ["X", "NV2", "NV1"],
        ["NV2", "X", "SYS"],
        ["NV1", "SYS", "X"],
    ]
    assert m.nvlinks(0, 1) == 2 and topology.link_class(m.link(1, 2)) == "cross-numa"


def test_pcie_only_labels_and_missing_values() -> None:
    readings = [
        topology.TopoReading(0, "g", "0:1:0.0", ancestor={1: 10, 2: 40}),
        topology.TopoReading(1, "g", "0:2:0.0", ancestor={0: 10, 2: None}),
        topology.TopoReading(2, "g", "0:3:0.0", ancestor={0: 40, 1: None}),
    ]
    m = topology.topology_from_readings(readings)
    assert m.links[0] == ("X", "PIX", "NODE") and m.link(1, 2) == "N/A"
    text = topology.render_topology(m, legend=False)
    assert "GPU0\t X \tPIX\tNODE\tN/A\tN/A\t\tN/A" in text and "no NVLink" in text


def test_sample_from_fixture() -> None:
    fake = fake_pynvml(SNAPSHOT)
    nvml = gpu.Nvml(module=fake)
    s = nvml.sample()
    assert s.available and len(s.gpus) == 4
    g0 = s.gpus[0]
    assert g0.name == "NVIDIA H200" and g0.pci_bus_id == "00000000:00:06.0"
    assert g0.power_w == pytest.approx(123.627) and g0.power_limit_w == 700
    assert (g0.temp_c, g0.sm_clock_mhz, g0.pcie_tx_kbs, g0.nvlink_active) == (34, 1980, 1443, 18)
    assert g0.pcie_rx_kbs is None and g0.nvlink_tx_kib is None  # not recorded: not available
    assert s.gpu_of_pid() == {4242: 1}
    assert "nvmlDeviceGetFieldValues" in nvml.errors
    assert fake.calls == ["init"]  # initialised once for both reads
    nvml.close()
    assert fake.calls == ["init", "shutdown"]


def test_p2p_index_tuple_bug_is_worked_around() -> None:
    nvml = gpu.Nvml(module=fake_pynvml(SNAPSHOT))
    assert nvml.const("NVML_P2P_CAPS_INDEX_READ", 0) == 0


def no_library_module() -> types.ModuleType:
    m = types.ModuleType("pynvml")

    def init():
        raise NVMLError_LibraryNotFound(12)

    m.nvmlInit = init
    m.NVMLError = NVMLError
    return m


def test_main_topo_without_nvml_prints_one_line(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", no_library_module())
    assert main_topo([]) == 0
    out = capsys.readouterr().out
    assert out.strip() == "NVML not available: libnvidia-ml.so.1 not found"
    assert out.count("\n") == 1


def test_main_topo_without_pynvml_installed(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    assert main_topo(["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["available"] is False and "not installed" in data["reason"]


def test_unavailable_nvml_reads_as_values_not_errors() -> None:
    nvml = gpu.Nvml(module=no_library_module())
    assert not nvml.available and nvml.device_count() == 0
    assert nvml.call("nvmlDeviceGetCount") is None
    sample = nvml.sample()
    assert not sample.available and sample.gpus == () and "libnvidia-ml" in sample.reason
    assert not nvml.topology().available


def test_main_topo_json_with_fake(capsys) -> None:
    assert main_topo(["--json"], source=gpu.Nvml(module=fake_pynvml(SNAPSHOT))) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["links"][0] == ["X", "NV18", "NV18", "NV18"]
    assert data["gpus"][3]["active_nvlinks"] == 18 and data["gpus"][0]["cpu_affinity"] == "0-63"


def test_mask_to_ranges() -> None:
    assert topology.mask_to_ranges([0b1011, 1]) == "0-1,3,64"
    assert topology.mask_to_ranges([0]) is None and topology.mask_to_ranges(None) is None


def test_process_stats_of_self_and_gone_pid() -> None:
    tracker = ProcessStats()
    gone = 2**22 + 12345  # above the default pid_max, so never a live process
    stats = process_stats([os.getpid(), gone], tracker)
    assert set(stats) == {os.getpid()}
    cpu, rss = stats[os.getpid()]
    assert cpu >= 0.0 and rss > 1_000_000


def test_a_sample_carries_the_driver_version_the_gpu_tab_shows() -> None:
    """The GPU tab's header read `driver ?` on 4x H200 (s9-call1): nothing real set it."""
    nvml = gpu.Nvml(module=fake_pynvml(SNAPSHOT))
    assert nvml.sample().driver == SNAPSHOT["driver"]
    assert nvml.sample().to_dict()["driver"] == SNAPSHOT["driver"]
