"""nsys end to end without a GPU: finding nsys and QdstrmImporter in the install layouts seen on
the GPU machines, the cheap `nsys profile` flags, the importer (with and without its carried
libraries), `nsys stats` CSV tables (built from the H100 ViT-L/32 capture's own kernels), and
the per-rank statistics and window cost put into the capture summary. nsys and the importer are
small stand-in scripts that behave like the real ones (file names, CSV format, loader errors)."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from ddptop.analysis import nsys_stats
from ddptop.analysis.capture import Capture
from ddptop.run import nsys

FIXTURES = Path(__file__).parents[1] / "fixtures" / "nsys"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


# ---------------------------------------------------------------------------- stats tables


def test_kernel_table_one_rank_h100_onerankreduce_is_communication() -> None:
    rows = nsys_stats.parse_table(fixture("h100_vit_l_1rank_cuda_gpu_kern_sum.csv"))
    assert len(rows) == 13 and all(r["name"] and r["total"] > 0 for r in rows)
    s = nsys_stats.kernel_summary(rows)
    # NCCL's one-rank all-reduce has no "nccl" in its name; 3 calls in the 3-step window
    assert [k["name"][:30] for k in s["comm_kernels"]] == ["__nv_static_32__b4148644_10_on"]
    assert s["comm_kernels"][0]["count"] == 3
    assert s["comm_ms"] == pytest.approx(3.045, abs=1e-3)
    assert s["kernel_ms"] == pytest.approx(231.166, abs=1e-3)
    assert s["compute_ms"] == pytest.approx(s["kernel_ms"] - s["comm_ms"], abs=1e-3)
    top = s["top"][0]
    assert top["name"].startswith("sm80_xmma_gemm") and top["count"] == 216
    assert top["ms"] == pytest.approx(58.2758, abs=1e-4) and top["min_ms"] == pytest.approx(0.099587)
    assert top["max_ms"] == pytest.approx(0.361577) and top["std_ms"] == pytest.approx(0.1203, abs=1e-4)


def test_kernel_table_two_ranks_ring_kernels_and_broadcast_gemm() -> None:
    s = nsys_stats.kernel_summary(nsys_stats.parse_table(fixture("h200x2_rank1_cuda_gpu_kern_sum.csv")))
    names = [k["name"] for k in s["comm_kernels"]]
    assert len(names) == 2 and all(n.startswith("ncclDevKernel_") for n in names)
    # the GEMM whose epilogue is a "Broadcast" is compute, not communication
    assert s["comm_ms"] == pytest.approx(66.701376 + 2.130944, abs=1e-3)
    assert s["compute_ms"] == pytest.approx(22.448512 + 10.47616 + 5.1312, abs=1e-3)
    assert s["comm_share"] == pytest.approx(0.644, abs=1e-3)
    assert s["kernels"] == 24 + 216 + 72 + 1302 + 3


def test_old_headers_and_other_units() -> None:
    rows = nsys_stats.parse_table(fixture("old_format_cuda_gpu_kern_sum.csv"))
    assert rows[0]["pct"] == 70.0 and rows[0]["count"] == 10 and rows[0]["avg"] == pytest.approx(0.7)
    assert nsys_stats.kernel_summary(rows)["comm_ms"] == pytest.approx(7.0)
    us = "Time (%),Total Time (us),Instances,Name\n100.0,1500.5,2,ncclDevKernel_AllGather\n"
    assert nsys_stats.parse_table(us)[0]["total"] == pytest.approx(1.5005)


def test_nvtx_steps_and_memory_table() -> None:
    nvtx = nsys_stats.nvtx_summary(nsys_stats.parse_table(fixture("h100_vit_l_1rank_nvtx_sum.csv")))
    assert nvtx["steps"] == [20, 21, 22]
    assert nvtx["step_ms"] == [123.749, 117.452, 121.54]
    assert nvtx["ranges"][-1]["name"] == "NCCL:ncclAllReduce"
    mem = nsys_stats.mem_summary(nsys_stats.parse_table(fixture("h100_vit_l_1rank_cuda_gpu_mem_time_sum.csv")))
    assert mem["memory_ms"] == pytest.approx(10.065, abs=1e-3)
    assert mem["ops"][0] == {"name": "[CUDA memcpy Device-to-Device]", "count": 1992, "ms": 8.472008, "avg_ms": 0.004253,
                             "med_ms": 0.001377, "min_ms": 0.000991, "max_ms": 0.015392, "std_ms": 0.004256,
                             "pct": 84.2}


@pytest.mark.parametrize("text", [
    "", "no csv here\n", "Time (%),Name\n", "Time (%),Total Time (ns),Name\n1,2\n\"unterminated,3,4\n",
    "Time (%),Total Time (ns),Name\nnan,inf,x\n" + "1,2,y\n" * 5, "\x00\x01,\x02,\x03\n",
])
def test_bad_tables_give_no_rows_or_only_good_ones(text: str) -> None:
    rows = nsys_stats.parse_table(text)
    assert all(r["name"] in ("x", "y") for r in rows)
    nsys_stats.summarize_stats({"cuda_gpu_kern_sum": text, "nvtx_sum": text, "cuda_gpu_mem_time_sum": text})


def test_reports_chosen_from_help_reports() -> None:
    available = nsys_stats.available_reports(fixture("help_reports.txt"))
    assert "cuda_gpu_kern_sum" in available and "nvtx_sum" in available and "osrt_sum" in available
    assert "the_following" not in available and len(available) == 16
    assert nsys_stats.choose_reports(available) == ["cuda_gpu_kern_sum", "nvtx_sum", "cuda_gpu_mem_time_sum"]
    newer = available + ["nccl_gpu_overlap_sum", "nccl_sum"]
    assert nsys_stats.choose_reports(newer)[3:] == ["nccl_gpu_overlap_sum", "nccl_sum"]
    assert nsys_stats.choose_reports([]) == ["cuda_gpu_kern_sum", "nvtx_sum"]  # list unreadable: ask anyway


def test_profile_flags_are_cheap_and_follow_what_nsys_knows() -> None:
    flags = nsys_stats.profile_flags(set())
    assert flags == ["--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none", "--capture-range-end=repeat"]
    assert not any("osrt" in f for f in flags)
    known = nsys_stats.profile_options("  --cuda-trace-scope=<process-tree|system-wide>\n  -t, --trace=\n")
    assert "--cuda-trace-scope" in known and "--trace" in known
    assert nsys_stats.profile_flags(known)[-1] == "--cuda-trace-scope=process-tree"
    override = nsys_stats.profile_flags(known, "--trace=cuda,nvtx,osrt --capture-range-end=stop")
    assert override == ["--trace=cuda,nvtx,osrt", "--capture-range-end=stop", "--cuda-trace-scope=process-tree"]


def test_failure_lines() -> None:
    err = ("QdstrmImporter: error while loading shared libraries: libdw.so.1: cannot open shared object file: "
           "No such file or directory\n")
    line = nsys_stats.failure_line("QdstrmImporter", err, 127)
    assert line == ("QdstrmImporter cannot start: libdw.so.1 is missing (Debian/Ubuntu package libdw1); "
                    "put it in a folder named by DDPTOP_NSYS_LIBS")
    line = nsys_stats.failure_line("nsys stats", "Processing...\nERROR: report file is corrupt\n\x1b[0m\n", 1)
    assert line == "nsys stats failed (exit code 1): ERROR: report file is corrupt"
    assert "\n" not in nsys_stats.failure_line("x", "a\n" * 1000 + "fatal " + "y" * 5000, None)


# ---------------------------------------------------------------------------- finding nsys


def test_find_nsys_in_the_usual_places(tmp_path: Path) -> None:
    empty = str(tmp_path / "bin")
    compute = executable(tmp_path / "opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys", "#!/bin/sh\n")
    executable(tmp_path / "opt/nvidia/nsight-compute/2024.1.0/host/target-linux-x64/nsys", "#!/bin/sh\n")
    assert nsys.find_nsys(path=empty, root=str(tmp_path)) == str(compute)  # newest bundled copy
    systems = executable(tmp_path / "opt/nvidia/nsight-systems/2025.5.1/bin/nsys", "#!/bin/sh\n")
    assert nsys.find_nsys(path=empty, root=str(tmp_path)) == str(systems)  # a full Nsight Systems first
    on_path = executable(tmp_path / "bin/nsys", "#!/bin/sh\n")
    assert nsys.find_nsys(path=empty, root=str(tmp_path)) == str(on_path)
    assert nsys.find_nsys(str(tmp_path / "missing")) is None
    assert nsys.find_nsys(str(compute)) == str(compute)


def test_find_importer_next_to_nsys(tmp_path: Path) -> None:
    ver = tmp_path / "nsight-compute/2025.3.1/host"
    bundled = executable(ver / "target-linux-x64/nsys", "#!/bin/sh\n")
    importer = executable(ver / "linux-desktop-glibc_2_11_3-x64/QdstrmImporter", "#!/bin/sh\n")
    assert nsys.find_importer(str(bundled), path="") == str(importer)
    root = tmp_path / "nsight-systems/2025.5.1"
    full = executable(root / "target-linux-x64/nsys", "#!/bin/sh\n")
    assert nsys.find_importer(str(full), path="") is None
    importer = executable(root / "host-linux-x64/QdstrmImporter", "#!/bin/sh\n")
    assert nsys.find_importer(str(full), path="") == str(importer)
    link = tmp_path / "usr/bin/nsys"
    link.parent.mkdir(parents=True)
    link.symlink_to(full)
    assert nsys.find_importer(str(link), path="") == str(importer)


# ---------------------------------------------------------------------------- end to end with stand-ins

FAKE_NSYS = r'''#!PYTHON
import os, pathlib, sys
a = sys.argv[1:]
fixtures = pathlib.Path(os.environ["NSYS_FIXTURES"])
if a[:2] == ["profile", "--help"]:
    print("  --capture-range=\n  --cuda-trace-scope=process-tree\n  --sample=\n"); raise SystemExit
if a[:2] == ["stats", "--help-reports"]:
    print((fixtures / "help_reports.txt").read_text()); raise SystemExit
if a[:2] == ["stats", "--help"]:
    print(os.environ.get("NSYS_STATS_HELP", "")); raise SystemExit
if a[0] == "stats" and os.environ.get("NSYS_ARGV_LOG"):
    with open(os.environ["NSYS_ARGV_LOG"], "a") as log:
        log.write(" ".join(a) + "\n")
if a[0] == "stats" and "--filter-nvtx" in a and os.environ.get("NSYS_NO_WINDOW"):
    print("WARNING: the NVTX range was not found: no data"); raise SystemExit
if a[0] == "stats":
    reports = [a[i + 1] for i, x in enumerate(a) if x == "--report"]
    base = a[a.index("--output") + 1]
    rep = pathlib.Path(a[-1])
    if rep.read_bytes() == b"corrupt":
        print("Processing [" + str(rep) + "]...", flush=True)
        print("ERROR: Failed to export the report: file is corrupt", file=sys.stderr); raise SystemExit(1)
    # as nsys 2025.3 names them: a filtered table's file carries the range (s9-call1)
    nvtx = "_nvtx=" + a[a.index("--filter-nvtx") + 1] if "--filter-nvtx" in a else ""
    for r in reports:
        src = fixtures / ("h100_vit_l_1rank_" + r + ".csv")
        if src.exists():
            pathlib.Path(base + "_" + r + nvtx + ".csv").write_text(src.read_text())
        else:
            print("SKIPPED: " + str(rep) + " does not contain " + r + " data.")
    raise SystemExit
raise SystemExit(2)
'''

FAKE_IMPORTER = r'''#!PYTHON
import os, pathlib, sys
libs = os.environ.get("LD_LIBRARY_PATH", "").split(":")
if not any(d and pathlib.Path(d, "libdw.so.1").exists() for d in libs):
    print(sys.argv[0] + ": error while loading shared libraries: libdw.so.1: cannot open shared object file: "
          "No such file or directory", file=sys.stderr)
    raise SystemExit(127)
raw = pathlib.Path(sys.argv[sys.argv.index("-i") + 1])
raw.with_suffix(".nsys-rep").write_bytes(b"corrupt" if raw.read_bytes() == b"corrupt" else b"report")
'''


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    host = tmp_path / "nsight-compute/2025.3.1/host"
    fake = executable(host / "target-linux-x64/nsys", FAKE_NSYS.replace("PYTHON", sys.executable))
    executable(host / "linux-desktop-glibc_2_11_3-x64/QdstrmImporter", FAKE_IMPORTER.replace("PYTHON", sys.executable))
    monkeypatch.setenv("NSYS_FIXTURES", str(FIXTURES))
    libs = tmp_path / "carried"
    libs.mkdir()
    return str(fake), libs


def window(out_dir: Path, rank: int, start_s: float, stop_s: float) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"rank{rank}.nsys-window").write_text(json.dumps({"start_s": start_s, "stop_s": stop_s,
                                                                 "steps": [20, 22]}))


def test_raw_streams_imported_with_carried_libs_then_stats_into_the_capture(tools, tmp_path) -> None:
    fake, libs = tools
    (libs / "libdw.so.1").write_bytes(b"\x7fELF")
    caps = tmp_path / "captures"
    caps.mkdir()
    (caps / "nsys_rank0.qdstrm").write_bytes(b"raw")
    (caps / "nsys_rank1.1.qdstrm").write_bytes(b"raw")
    env = {"PATH": "/usr/bin:/bin", nsys.LIBS_ENV: str(libs)}
    info = asyncio.run(nsys.nsys_report(fake, caps, env))
    assert info["importer"].endswith("linux-desktop-glibc_2_11_3-x64/QdstrmImporter")
    assert "note" not in info and not info["errors"]
    assert sorted(p.name for p in caps.glob("*.nsys-rep")) == ["nsys_rank0.nsys-rep", "nsys_rank1.1.nsys-rep"]
    assert not list(caps.glob("*.qdstrm"))  # imported streams are removed, as nsys does
    assert [(e["rank"], e["window"]) for e in info["reports"]] == [(0, 0), (1, 1)]
    r0 = info["reports"][0]
    assert r0["comm_ms"] == pytest.approx(3.045, abs=1e-3)
    assert r0["cuda_gpu_kern_sum"]["top"][0]["count"] == 216
    assert r0["nvtx_sum"]["steps"] == [20, 21, 22]
    assert r0["cuda_gpu_mem_time_sum"]["memory_ms"] == pytest.approx(10.065, abs=1e-3)
    assert Path(r0["csv"][0]).name == "nsys_rank0_cuda_gpu_kern_sum.csv"
    assert "NCCL 3.0 ms (1%)" in info["stats"]["nsys_rank0.nsys-rep"]

    cap = Capture(1, 20, 3, "nsys", str(caps / "1"), status="done", ranks={0: "written", 1: "written"},
                  summary={"ranks": {"0": {"note": "no trace to summarise (nsys writes its own report)"}}})
    window(caps / "1", 0, 0.8, 2.4)
    window(caps / "1", 1, 0.7, 3.1)
    nsys.attach_nsys([Capture(2, 5, 1, "torch", "/x"), cap], info)
    s = cap.summary
    assert s["source"] == "nsys stats" and s["nsys_held_s_max"] == 3.8
    assert s["comm_ms_mean"] == pytest.approx(3.045, abs=1e-3)
    assert s["ranks"]["0"]["held_s"] == 3.2 and s["ranks"]["0"]["times"] == {"start_s": 0.8, "stop_s": 2.4}
    assert s["ranks"]["0"]["note"].startswith("held 3.2 s by nsys; kernels 231.2 ms, NCCL 3.0 ms (1%); top sm80")
    assert cap.files[1] == [str(caps / "nsys_rank1.1.nsys-rep")]
    json.dumps(s)


def test_importer_without_its_library_says_so_in_one_line(tools, tmp_path) -> None:
    fake, _libs = tools
    caps = tmp_path / "captures"
    caps.mkdir()
    for rank in range(4):
        (caps / f"nsys_rank{rank}.qdstrm").write_bytes(b"raw")
    info = asyncio.run(nsys.nsys_report(fake, caps, {"PATH": "/usr/bin:/bin"}))
    assert len(info["errors"]) == 1  # tried once, not once per file
    assert info["note"] == ("no .nsys-rep report: QdstrmImporter cannot start: libdw.so.1 is missing (Debian/Ubuntu "
                            "package libdw1); put it in a folder named by DDPTOP_NSYS_LIBS; torch.profiler captures "
                            "still work (--profiler torch)")
    assert len(list(caps.glob("*.qdstrm"))) == 4  # nothing lost
    cap = Capture(1, 20, 3, "nsys", str(caps / "1"), ranks={0: "written"})
    window(caps / "1", 0, 0.5, 1.0)
    nsys.attach_nsys([cap], info)
    assert cap.summary["ranks"]["0"]["held_s"] == 1.5
    assert "libdw.so.1 is missing" in cap.summary["ranks"]["0"]["note"]


def test_no_importer_and_broken_report(tools, tmp_path) -> None:
    fake, libs = tools
    (libs / "libdw.so.1").write_bytes(b"")
    caps = tmp_path / "captures"
    caps.mkdir()
    (caps / "nsys_rank0.qdstrm").write_bytes(b"corrupt")
    info = asyncio.run(nsys.nsys_report(fake, caps, {nsys.LIBS_ENV: str(libs), "PATH": "/usr/bin:/bin"}))
    r0 = info["reports"][0]
    assert r0["problem"] == "nsys stats failed (exit code 1): ERROR: Failed to export the report: file is corrupt"
    assert info["stats"]["nsys_rank0.nsys-rep"] == r0["problem"]

    lone = executable(tmp_path / "alone/nsys", FAKE_NSYS.replace("PYTHON", sys.executable))
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "nsys_rank0.qdstrm").write_bytes(b"raw")
    info = asyncio.run(nsys.nsys_report(str(lone), raw, {"PATH": ""}))
    assert "no QdstrmImporter was found next to" in info["note"] and info["importer"] is None
    info = asyncio.run(nsys.nsys_report(str(lone), tmp_path / "nothing", {"PATH": ""}))
    assert info["note"].startswith("no .nsys-rep report: nsys wrote nothing for the capture windows")


def test_rank_command_and_plan(tools, tmp_path, monkeypatch) -> None:
    from ddptop.model.config import RunConfig
    from ddptop.run.launcher import build_plan

    fake, _ = tools
    cmd = nsys.profile_command(fake, tmp_path / "nsys_rank%q{RANK}", {})
    assert cmd[:3] == [fake, "profile", "--capture-range=cudaProfilerApi"]
    assert "--cuda-trace-scope=process-tree" in cmd and "--sample=none" in cmd and "--trace=cuda,nvtx" in cmd
    assert cmd[-2:] == ["-o", str(tmp_path / "nsys_rank%q{RANK}")]
    plan = build_plan(RunConfig(nproc=1), tmp_path, "unix:/x", "t", "r", base_env={"PATH": "/bin"}, nsys=fake)
    assert plan.argv[plan.argv.index("--no-python") + 2:][:2] == [fake, "profile"]
    env = {nsys_stats.FLAGS_ENV: "--trace=cuda,nvtx,osrt --capture-range-end=stop"}
    cmd = nsys.profile_command(fake, tmp_path / "o", env)
    assert "--trace=cuda,nvtx,osrt" in cmd and "--capture-range-end=stop" in cmd and "--sample=none" not in cmd


def test_a_default_run_never_wraps_its_ranks_in_nsys(tools, tmp_path, monkeypatch) -> None:
    """nsys found on PATH and GPUs present: the default (--profiler auto) still starts every
    rank plainly, since nsys injects its CUDA and NVTX interception at process start whatever
    the capture range (issue 42: +7-18% per kernel launch). Only --profiler nsys wraps them."""
    import argparse

    from ddptop import cli
    from ddptop.model.config import RunConfig
    from ddptop.run.launcher import build_plan

    fake, _ = tools
    monkeypatch.setenv("PATH", f"{Path(fake).parent}:{os.environ.get('PATH', '')}")
    monkeypatch.setattr(cli, "visible_gpus", lambda: 2)
    config = RunConfig(nproc=2, backend="nccl")
    args = argparse.Namespace(capture=["10:3"], profiler="auto", nsys_path=None)
    assert nsys.find_nsys(None) == fake  # found: the case the old default wrapped
    options = cli.capture_options(args, config)
    assert (options.profiler, options.nsys) == ("torch", None)
    plan = build_plan(config, tmp_path, "unix:/x", "t", "r", base_env={"PATH": os.environ["PATH"]}, nsys=options.nsys)
    assert not any("nsys" in a for a in plan.argv)
    options = cli.capture_options(argparse.Namespace(capture=[], profiler="nsys", nsys_path=None), config)
    assert (options.profiler, options.nsys) == ("nsys", fake)


def test_ddptops_root_is_not_on_the_ranks_pythonpath(tmp_path) -> None:
    """The ranks find ddptop through DDPTOP_PACKAGE_ROOT, appended last to sys.path by the boot:
    first on PYTHONPATH it shadowed a script's own `trainer` and changed the paths torch's
    logging prints (a venv inside the checkout: `.venv/lib/.../torch/...`). A supervisor's own
    PYTHONPATH (with the root) is not handed to the ranks; the user's is."""
    from ddptop.model.config import RunConfig
    from ddptop.run.launcher import BOOT_DIR, PACKAGE_ROOT, build_plan
    from ddptop.wire import protocol

    plan = build_plan(RunConfig(nproc=1), tmp_path, "unix:/x", "t", "r", base_env={"PYTHONPATH": "/mine"})
    assert plan.env["PYTHONPATH"] == f"{BOOT_DIR}{os.pathsep}/mine"
    assert plan.env[protocol.ENV_PACKAGE_ROOT] == str(PACKAGE_ROOT)
    supervised = {"PYTHONPATH": f"{PACKAGE_ROOT}{os.pathsep}/mine", protocol.ENV_USER_PYTHONPATH: "/mine"}
    plan = build_plan(RunConfig(nproc=1), tmp_path, "unix:/x", "t", "r", base_env=supervised)
    assert plan.env["PYTHONPATH"] == f"{BOOT_DIR}{os.pathsep}/mine" and protocol.ENV_USER_PYTHONPATH not in plan.env


@pytest.mark.parametrize("case", ["filtered", "no range in the report", "an nsys without the filter"])
def test_stats_keep_to_the_windows_own_steps_where_nsys_can(tools, tmp_path, monkeypatch, case) -> None:
    """Issue 45: nsys's capture range opens a step early (its start-up out of the window) and
    the window's own steps are an NVTX range: `nsys stats --filter-nvtx` keeps the figures to
    it; a report without that range, or an nsys without the filter, gets the whole range, and
    the capture's line says which."""
    fake, _ = tools
    log = tmp_path / "argv.log"
    monkeypatch.setenv("NSYS_ARGV_LOG", str(log))
    if case != "an nsys without the filter":
        monkeypatch.setenv("NSYS_STATS_HELP", "  --filter-nvtx=<range[@domain][/index]>\n  --filter-time=<...>")
    if case == "no range in the report":
        monkeypatch.setenv("NSYS_NO_WINDOW", "1")
    caps = tmp_path / "captures"
    caps.mkdir()
    (caps / "nsys_rank0.nsys-rep").write_bytes(b"report")
    info = asyncio.run(nsys.nsys_report(fake, caps, {"PATH": "/usr/bin:/bin"}))
    r0 = info["reports"][0]
    runs = log.read_text().splitlines()
    assert r0["cuda_gpu_kern_sum"]["top"][0]["count"] == 216  # the figures are there in every case
    if case == "filtered":
        assert len(runs) == 1 and "--filter-nvtx ddptop_window" in runs[0]
        assert r0["window_filter"] == "the window's steps only (NVTX range ddptop_window)"
        assert all(c.endswith("_nvtx=ddptop_window.csv") for c in r0["csv"])
    elif case == "no range in the report":
        assert len(runs) == 2 and "--filter-nvtx" in runs[0] and "--filter-nvtx" not in runs[1]
        assert r0["window_filter"].startswith("the whole capture range, its warmup step included")
    else:
        assert len(runs) == 1 and "--filter-nvtx" not in runs[0]
        assert r0["window_filter"] == "the whole capture range"
    assert info["stats"]["nsys_rank0.nsys-rep"].endswith(f"figures over {r0['window_filter']}")


@pytest.mark.parametrize(("nproc", "theirs", "expect"), [(1, None, None), (2, None, "1"), (2, "4", "4"), (1, "3", "3")])
def test_omp_threads_are_set_only_where_plain_torchrun_sets_them(tmp_path, nproc, theirs, expect) -> None:
    """torchrun sets OMP_NUM_THREADS=1 only with more than one process a node and none set:
    with one, ddptop setting it anyway changed the job (a CPU rank ran on one thread; in
    `ddptop cost --lockstep` the plain job's thread pool then slowed its partner's turns)."""
    from ddptop.model.config import RunConfig
    from ddptop.run.launcher import build_plan

    base = {"PATH": "/bin", **({"OMP_NUM_THREADS": theirs} if theirs else {})}
    plan = build_plan(RunConfig(nproc=nproc), tmp_path, "unix:/x", "t", "r", base_env=base)
    assert plan.env.get("OMP_NUM_THREADS") == expect
