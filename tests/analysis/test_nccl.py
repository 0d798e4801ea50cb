"""NCCL log parser: real logs from 4x H200 (NVLink, NCCL_P2P_DISABLE=1, TUNING subsystem)
and synthetic lines in the other formats NCCL has printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddptop.analysis import nccl
from ddptop.commands.nccl import main_nccl

FIXTURES = Path(__file__).parents[1] / "fixtures" / "nccl"
LOGS = sorted(FIXTURES.glob("*.log"))


def parse(name: str) -> nccl.NcclReport:
    return nccl.parse_lines((FIXTURES / name).read_text().splitlines())


def test_fixtures_present() -> None:
    assert {p.name for p in LOGS} >= {
        "h200x4_nvlink_info.log",
        "h200x4_p2pdisable_shm_info.log",
        "h200x2_nvlink_subsys.log",
    }


@pytest.mark.parametrize("path", [p for p in LOGS if p.name in (
    "h200x4_nvlink_info.log", "h200x4_p2pdisable_shm_info.log", "h200x2_nvlink_subsys.log")], ids=lambda p: p.name)
def test_every_real_run_parses_cleanly(path: Path) -> None:
    report = nccl.parse_lines(path.read_text().splitlines())
    assert report.version == "2.28.9" and report.version_full == "2.28.9+cuda13.0"
    assert report.versions == ("2.28.9+cuda13.0",)
    assert report.network == "Socket"
    assert report.garbled_count == 0 and report.unknown_count == 0
    assert report.other_count == 4  # torchrun's OMP_NUM_THREADS banner
    comm = report.primary
    assert comm is not None and comm.nnodes == 1 and comm.comm_id
    assert sorted(comm.ranks) == list(range(comm.nranks))
    # every ring neighbour pair has a transport, in both runs
    assert comm.ring_pairs() and comm.ring_pairs() <= set(comm.transports)
    json.loads(report.to_json())


def test_nvlink_run_is_p2p_for_every_ring_neighbour() -> None:
    report = parse("h200x4_nvlink_info.log")
    comm = report.primary
    assert report.nranks == 4 and len(report.communicators) == 1
    assert comm.ring_pairs() == {(0, 1), (1, 2), (2, 3), (3, 0)}
    assert comm.rings[0] == (0, 1, 2, 3) and len(comm.rings) == 24
    for pair in comm.ring_pairs():
        t = report.transports[pair]
        assert (t.label, t.via, t.kind) == ("P2P", "P2P/CUMEM", "p2p")
        assert t.channels == tuple(range(24))
    assert comm.channels["coll"] == 24 and comm.channels["p2p_per_peer"] == 32
    assert comm.trees[0][3] == nccl.TreeNode(up=2, down=())
    assert comm.trees[0][0] == nccl.TreeNode(up=-1, down=(1,))
    assert comm.ranks[2].cuda_dev == 2 and comm.ranks[2].bus_id == "80"
    assert report.env == {"NCCL_NVLS_ENABLE": "0"}


def test_p2p_disabled_run_is_shm() -> None:
    report = parse("h200x4_p2pdisable_shm_info.log")
    assert report.nranks == 4
    assert report.env["NCCL_P2P_DISABLE"] == "1"
    pairs = report.primary.ring_pairs()
    assert pairs == {(0, 1), (1, 2), (2, 3), (3, 0)}
    for pair in pairs:
        t = report.transports[pair]
        assert (t.label, t.via, t.kind) == ("SHM", "SHM/direct/direct", "shm")
        assert t.channels == (0, 1, 2, 3)
    matrix = nccl.render_matrix(report)
    assert matrix.splitlines()[1].split() == ["r0", "X", "SHM", ".", "."]


def test_tuning_log_gives_allreduce_sizes_algorithm_protocol() -> None:
    report = parse("h200x2_nvlink_subsys.log")
    assert report.nranks == 2
    allreduce = [c for c in report.collectives if c.op == "AllReduce"]
    assert sum(c.calls for c in allreduce) == 66
    sizes = {c.bytes: c.calls for c in allreduce}
    assert (
        sizes[28351488] == 55 and sizes[9603072] == 5 and sizes[352896928] == 1 and len(sizes) == 4
    )
    assert {(c.algorithm, c.protocol, c.channels) for c in allreduce} == {("RING", "SIMPLE", 24)}
    small = [c for c in report.collectives if c.op == "Broadcast" and c.bytes == 3328]
    assert small and (small[0].algorithm, small[0].protocol, small[0].channels) == ("RING", "LL", 1)
    assert report.algorithms()["AllReduce"] == {"RING/SIMPLE"}
    # the GRAPH subsystem lines: rings as prev -> rank -> next, trees as up -> rank -> down
    comm = report.primary
    assert comm.ring_pairs() == {(0, 1), (1, 0)}
    assert comm.trees[6][1] == nccl.TreeNode(up=-1, down=(0,))
    assert comm.graph_types == ("NVL/PIX",)
    assert "AllReduce: 66 calls" in nccl.render_facts(report)


# ---------------------------------------------------------------------------- synthetic formats

PREFIX = "node1:100:100 [0] NCCL INFO "


def lines(*msgs: str, prefix: str = PREFIX) -> list[str]:
    return [prefix + m for m in msgs]


def test_old_busid_format_and_ipc() -> None:
    report = nccl.parse_lines(
        lines(
            "NCCL version 2.7.8+cuda11.0",
            "Channel 00 : 0[1b000] -> 1[1c000] via P2P/IPC",
            "Channel 01 : 0[1b000] -> 1[1c000] via P2P/IPC/read",
            "Channel 01 : 0[1b000] -> 1[1c000] via P2P/IPC/read",
            "Channel 00 :    0   1",
            "Trees [0] 1/-1/-1->0->-1 [1] -1/-1/-1->0->1",
        )
    )
    assert report.version == "2.7.8"
    t = report.transports[(0, 1)]
    assert t.label in ("P2P", "P2P/read") and t.channels in ((0,), (1,))
    assert set(t.others) == {"P2P/IPC", "P2P/IPC/read"} - {t.via}
    comm = report.primary
    assert comm.ranks[0].bus_id == "1b000" and comm.rings[0] == (0, 1)
    assert comm.trees[1][0] == nccl.TreeNode(up=1, down=())


def test_net_ib_gdrdma_send_receive_and_socket() -> None:
    report = nccl.parse_lines(
        lines(
            "Using network IB",
            "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.0.0.1<0>",
            "Channel 00/0 : 7[7] -> 8[0] [send] via NET/IB/0/GDRDMA",
            "Channel 01/0 : 7[7] -> 8[0] [send] via NET/IB/1(6)/GDRDMA(PCI)/Shared",
            "Channel 00/0 : 15[7] -> 0[0] [receive] via NET/IB/0/GDRDMA",
            "Channel 00/0 : 3[3] -> 4[4] via NET/Socket/0",
            "Channel 02/1 : 1[1] -> 2[2] via P2P/CUMEM/read",
        )
    )
    t = report.transports
    assert (t[(7, 8)].label, t[(7, 8)].kind, t[(7, 8)].gdr) == ("NET/IB", "net", True)
    assert t[(7, 8)].channels in ((0,), (1,))
    assert t[(15, 0)].label == "NET/IB"  # [receive] lines still read src -> dst
    assert t[(3, 4)].label == "NET/Socket" and not t[(3, 4)].gdr
    assert t[(1, 2)].label == "P2P/read"
    assert report.network == "IB" and report.nranks == 16
    assert report.net_devices[0].startswith("IB: [0]mlx5_0")


def test_collnet_and_nvls() -> None:
    report = nccl.parse_lines(
        lines(
            "ncclCommInitRank comm 0xabc rank 0 nranks 8 cudaDev 0 nvmlDev 0 busId 18000 "
            "commId 0x99 - Init START",
            "CollNet 00/0 : 0 [send] via COLLNET/SHARP/0/GDRDMA",
            "CollNet 01/1 : 0 [receive] via COLLNET/SHARP/0/GDRDMA",
            "24 coll channels, 24 collnet channels, 16 nvls channels, 32 p2p channels, "
            "32 p2p channels per peer",
            "NVLS comm 0xabc headRank 0 nHeads 8 buffSize 1048576 nvlsPerRankSize 201326592",
            "AllReduce: 1048576 Bytes -> Algo NVLS proto SIMPLE channel{Lo..Hi}={0..15}",
        )
    )
    comm = report.primary
    assert comm.collnet == {0: "COLLNET/SHARP/0/GDRDMA"} and comm.nvls
    assert comm.channels["nvls"] == 16 and comm.comm_id == "0x99" and comm.nranks == 8
    assert nccl.transport_label("COLLNET/SHARP/0/GDRDMA") == "COLLNET"
    assert nccl.transport_label("NVLS") == "NVLS" and nccl.transport_class("NVLS") == "nvls"
    assert report.collectives[0].algorithm == "NVLS" and report.collectives[0].channels == 16


def test_torchrun_prefixes_old_tuning_and_coll_lines() -> None:
    report = nccl.parse_lines(
        [
            "[rank0]:node1:100:100 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM",
            "[default1]:node1:101:101 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via SHM/direct/direct",
            "[default1]:node1:101:101 [1] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0",
            PREFIX + "AllReduce: 4194304 Bytes -> Algo 1 proto 2 time 41.000000",
            PREFIX + "AllReduce: opCount 3 sendbuff 0x7f00 recvbuff 0x7f00 count 1024 "
            "datatype 7 op 0 root 0 comm 0xabc [nranks=2] stream 0x55",
            "node1:101:101 [1] NCCL INFO AllReduce: opCount 3 sendbuff 0x7f00 recvbuff 0x7f00 "
            "count 1024 datatype 7 op 0 root 0 comm 0xdef [nranks=2] stream 0x55",
        ]
    )
    assert report.transports[(0, 1)].label == "P2P" and report.transports[(1, 0)].label == "SHM"
    assert report.env == {"NCCL_SOCKET_IFNAME": "eth0"}
    tuned = [c for c in report.collectives if c.algorithm]
    assert (tuned[0].algorithm, tuned[0].protocol, tuned[0].bytes) == ("RING", "SIMPLE", 4194304)
    coll = [c for c in report.collectives if c.count]
    # COLL lines come from every rank; only one process is counted
    assert len(coll) == 1 and coll[0].calls == 1
    assert (coll[0].datatype, coll[0].bytes) == ("float32", 4096)


def test_garbage_and_unknown_lines_are_counted_never_fatal() -> None:
    report = nccl.parse_lines(
        [
            "hello from the training script",
            "\x00\x01\x02binary junk",
            "node1:100:100 [0] NCCL INFO Channel 00/0 : 3[3] -> 0[",  # truncated transport
            "node1:100:100 [0] NCCL INFO AllReduce: 12 Bytes -> Algo",  # truncated tuning
            "node1:100:100 [0] NCCL INFO Something NCCL 2.99 will print one day",
            "node1:100:100 [0] NCCL WARN NET/IB : Got async event : port error",
            "node1:100:100 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via FUTURE/Thing",
            "",
        ]
    )
    assert report.garbled_count == 3
    assert report.unknown_count == 1
    assert report.unknown_lines == ("Something NCCL 2.99 will print one day",)
    assert report.warnings == ("NET/IB : Got async event : port error",)
    assert report.other_count == 2
    assert (
        report.transports[(0, 1)].label == "FUTURE" and report.transports[(0, 1)].kind == "unknown"
    )


def test_transport_class_with_hardware_link() -> None:
    assert nccl.transport_class("P2P", "NV18") == "nvlink"
    assert nccl.transport_class("P2P/read", "PIX") == "pcie-p2p"
    assert nccl.transport_class("P2P") == "p2p"
    assert nccl.transport_class("SHM", "NV18") == "shm"
    assert nccl.transport_class("NET/IB") == "net"
    assert nccl.CLASS_ORDER.index("nvlink") < nccl.CLASS_ORDER.index("shm")


def test_incremental_feed_matches_batch() -> None:
    text = (FIXTURES / "h200x4_nvlink_info.log").read_text().splitlines()
    parser = nccl.NcclParser()
    for line in text[:100]:
        parser.feed(line)
    early = parser.report()
    for line in text[100:]:
        parser.feed(line)
    assert parser.report().transports == nccl.parse_lines(text).transports
    assert len(early.transports) < len(parser.report().transports)


def test_main_nccl_text_json_and_unreadable(tmp_path, capsys) -> None:
    log = str(FIXTURES / "h200x4_p2pdisable_shm_info.log")
    missing = str(tmp_path / "nope.log")
    assert main_nccl([log, missing]) == 0
    captured = capsys.readouterr()
    assert "SHM" in captured.out and "2.28.9" in captured.out
    assert captured.err.count("\n") == 1 and "nope.log" in captured.err

    assert main_nccl([log, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["transports"]["0->1"]["label"] == "SHM" and data["nranks"] == 4
    assert data["files_read"] == 1 and data["files_skipped"] == 0


def test_main_nccl_nothing_readable_exits_2(tmp_path, capsys) -> None:
    assert main_nccl([str(tmp_path / "a.log"), str(tmp_path / "b.log")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and "none of the log files" in err[-1]


def test_main_nccl_file_without_nccl_lines(tmp_path, capsys) -> None:
    p = tmp_path / "plain.log"
    p.write_text("just a training log\n")
    assert main_nccl([str(p)]) == 1
    assert "no NCCL_DEBUG lines" in capsys.readouterr().out


# ---------------------------------------------------------------------------- failed and odd logs


def test_failed_tree_ll128_log_shows_warnings_algo_matrix_and_no_fake_matrix() -> None:
    # NCCL_ALGO=Tree NCCL_PROTO=LL128 on 2x H200: init completes, the first all-gather fails, NCCL
    # never connects a channel (connections are made at the first collective)
    report = parse("h200x2_tree_ll128_failed.log")
    assert report.warning_count == 2 and report.warnings[0].startswith(
        "Error : no algorithm/protocol available for function AllGather with datatype ncclInt8.")
    assert not report.transports and report.unknown_count == 0 and report.garbled_count == 0
    assert report.env["NCCL_ALGO"] == "Tree" and report.env["NCCL_PROTO"] == "LL128"
    # the table is on lines of their own; rank 1's copy was cut by rank 0's line and is still read
    assert set(report.algo_matrix) == {"Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce"}
    assert report.algo_matrix["AllGather"] == {"LL": 0, "LL128": 1, "Simple": 0, "Tree": 1, "Ring": 0,
                                               "CollNetDirect": 0, "CollNetChain": 0, "NVLS": 0, "NVLSTree": 0,
                                               "PAT": 0}
    assert report.net_devices == ("Socket: [0]eth0:192.0.2.2<0>",)  # not "IB: [RO]..." after "No device found"
    assert report.net_failed == ("IB: no device found",)
    text = nccl.render_report(report)
    assert "no transport lines: NCCL never connected (see warnings)" in text
    assert "no direct connection" not in text and "r0 " not in text
    assert ("warnings: 2 NCCL WARN line(s); first: Error : no algorithm/protocol available for function "
            "AllGather") in text
    assert "  AllGather       0     1      0 |    1    0" in text
    assert "implements for: Broadcast, Reduce, AllGather, ReduceScatter" in text
    assert "not initialised: IB: no device found" in text
    data = json.loads(report.to_json())
    assert data["warning_count"] == 2 and data["algo_matrix"]["AllReduce"]["Tree"] == 1


def test_net_socket_log_transports_gdr_pxn() -> None:
    report = parse("net_socket_2node.log")
    comm = report.primary
    assert comm.nnodes == 2 and report.network == "Socket" and report.warning_count == 0
    assert report.unknown_count == 0 and report.garbled_count == 0
    for pair in ((0, 1), (1, 0)):
        t = report.transports[pair]
        assert (t.label, t.kind, t.gdr, t.pxn_rank, t.channels) == ("NET/Socket", "net", False, None, (0, 1))
    assert (comm.ring_pxn, comm.ring_gdr) == (0, 0)
    assert report.gdr_nics == ("Socket eth0: GPU Direct RDMA disabled",)
    assert report.net_failed == ("IB: no device found",) and all(d.startswith("Socket") for d in report.net_devices)
    assert report.algorithms()["AllReduce"] == {"RING/SIMPLE", "TREE/LL128"}
    text = nccl.render_report(report)
    assert "rings: GDR off, PXN off" in text and "r0->r1 via NET/Socket/0: GDR off, no PXN, channels 0,1" in text
    assert text.splitlines()[-2].split() == ["r1", "NET/Socket", "X"]
    assert json.loads(report.to_json())["transports"]["0->1"]["gdr"] is False


def test_ring_gdr_pxn_and_net_ib_pxn_per_channel() -> None:
    assert (parse("h200x2_nvlink_subsys.log").primary.ring_gdr, parse("h200x2_nvlink_subsys.log").primary.ring_pxn) \
        == (1, 0)
    report = nccl.parse_lines(lines(
        "Channel 01/0 : 7[7] -> 8[0] [send] via NET/IB/1(6)/GDRDMA(PCI)/Shared",
        "Channel 00/0 : 3[3] -> 4[4] [send] via NET/IB/0/GDRDMA",
        "NET/IB : GPU Direct RDMA Enabled for HCA 0 'mlx5_0'",
        "Connected all rings, use ring PXN 1 GDR 1",
    ))
    t = report.transports
    assert (t[(7, 8)].pxn_rank, t[(7, 8)].gdr) == (6, True) and t[(3, 4)].pxn_rank is None
    text = nccl.render_facts(report)
    assert "r7->r8 via NET/IB/1(6)/GDRDMA(PCI)/Shared: GDR on, PXN via r6, channels 1" in text
    assert "rings: GDR on, PXN on" in text and "IB mlx5_0: GPU Direct RDMA enabled" in text


def test_old_one_section_algo_matrix_behind_torchrun_prefixes() -> None:
    report = nccl.parse_lines([
        PREFIX + "Enabled NCCL Func/Proto/Algo Matrix:",
        "[default0]:     Function |    Tree    Ring",
        "[default0]:    AllReduce |      0       1",
        "    Broadcast | x y",  # not a row
    ])
    assert report.algo_matrix == {"AllReduce": {"Tree": 0, "Ring": 1}}
    assert report.other_count == 1


HOSTILE = [
    "h:1:1 [0] NCCL INFO Channel 00/0 : 99999999999999999999[0] -> 1[1] via P2P/CUMEM",
    "h:1:1 [0] NCCL INFO comm 0x1 rank 0 nranks 99999999999999999999 cudaDev 0 - Init START",
    "h:1:1 [0] NCCL INFO comm 0x1 rank 99999999999999999999999999999 nranks 2 cudaDev 0 - Init START",
    "h:1:1 [0] NCCL INFO Trees [99999999999] -1/-1/-1->0->1",
    "h:1:1 [0] NCCL INFO Channel 99999999999 :    0   1",
    "h:1:1 [0] NCCL INFO Ring 00 : 0 -> 1 -> 99999999999999999999",
    "h:1:1 [0] NCCL INFO Tree 0 : -1 -> 0 -> 1/-1/99999999999999999999",
    "h:1:1 [0] NCCL INFO CollNet 00/0 : 99999999999999999999 [send] via COLLNET/SHARP/0",
    "h:1:1 [0] NCCL INFO AllReduce: 99999999999999999999999 Bytes -> Algo 99999 proto 99999999999999999999",
    "h:1:1 [0] NCCL INFO AllReduce: opCount 1 sendbuff 0x1 recvbuff 0x1 count 9999999999999999999999 datatype "
    "99999999999999999999 op 0 root 0 comm 0x1 [nranks=2] stream 0x1",
    "h:99999999999999999999999:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via " + "P2P/" * 3000,
    "h:1:1 [0] NCCL INFO Connected all rings, use ring PXN 99999999999999999999 GDR 1",
    "    Function | " + "A " * 5000 + "|",
    "h:1:1 [0] NCCL INFO " + "\udcff" * 10,
]


def test_hostile_lines_are_refused_or_counted_and_output_stays_small() -> None:
    parser = nccl.NcclParser()
    for line in HOSTILE:
        parser.feed(line)  # never raises
    report = parser.report()
    assert report.refused_count >= 7
    assert report.refused_first.startswith("rank 99999999999999999999: Channel 00/0 : 99999999999999999999[0]")
    text = nccl.render_report(report)
    assert len(text) < 4000 and "refused: " in text
    json.loads(report.to_json())


def test_a_rank_in_the_thousands_is_counted_not_drawn() -> None:
    report = nccl.parse_lines(lines(
        "Channel 00/0 : 3000[0] -> 0[0] via P2P/CUMEM", "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM"))
    text = nccl.render_matrix(report)
    assert text == "3001 ranks: too many for a matrix; transports seen: P2P 2 pairs"


def test_cli_reads_gzip_whatever_its_name_and_says_when_cut(tmp_path, capsys) -> None:
    import gzip

    raw = (FIXTURES / "h200x4_nvlink_info.log").read_bytes()
    packed = tmp_path / "nccl.log.gz"
    packed.write_bytes(gzip.compress(raw))
    renamed = tmp_path / "nccl.txt"
    renamed.write_bytes(gzip.compress(raw))
    for path in (packed, renamed):
        assert main_nccl([str(path)]) == 0
        out = capsys.readouterr()
        assert "P2P" in out.out and "NCCL_DEBUG" not in out.out and not out.err
    cut = tmp_path / "cut.gz"
    cut.write_bytes(packed.read_bytes()[: len(packed.read_bytes()) // 2])
    assert main_nccl([str(cut)]) == 0
    out = capsys.readouterr()
    assert "NCCL 2.28.9" in out.out and out.err.strip() == f"ddptop nccl: {cut}: compressed log ends early (EOFError)"


def test_cli_bounded_read_of_dev_zero_and_a_huge_line(tmp_path, capsys) -> None:
    assert main_nccl(["/dev/zero", "--max-mb", "8"]) == 1
    out = capsys.readouterr()
    assert out.err.strip() == "ddptop nccl: /dev/zero: read the first 8 MB only (--max-mb)"
    assert "no NCCL_DEBUG lines" in out.out
    big = tmp_path / "big.log"
    big.write_text("x" * 3_000_000 + "\n" + (FIXTURES / "net_socket_2node.log").read_text())
    assert main_nccl([str(big), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["transports"]["0->1"]["label"] == "NET/Socket" and data["other_count"] == 1


def test_cli_usage_errors_are_one_line_exit_2(capsys) -> None:
    from ddptop.cli import main

    for argv in (["nccl", "--bogus", "x.log"], ["nccl"], ["nccl", "x.log", "--max-mb", "nan"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("ddptop: error: "), err
