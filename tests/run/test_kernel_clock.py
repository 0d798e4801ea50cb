"""ddptop's NCCL profiler plugin (ddptop/run/nccl_plugin.c), built with the machine's C compiler
and driven here the way NCCL's profiler interface v5 calls it (init, startEvent, the kernel
channels' start and stop with their GPU clocks), then read by the rank side
(ddptop.rank.kernel_clock) as NcclTimes does. The structs below are written from NCCL's
profiler_v5.h, apart from the plugin's own copy: their offsets must agree."""

import collections
import ctypes
import shutil
import time
from pathlib import Path

import pytest

from ddptop.model.config import RunConfig
from ddptop.rank import kernel_clock
from ddptop.rank.kernel_clock import KernelClock, match
from ddptop.run import nccl_plugin
from ddptop.run.launcher import build_plan
from ddptop.wire import protocol

COLL, KERNEL_CH, KERNEL_CH_STOP = 1 << 1, 1 << 6, 22


class Coll(ctypes.Structure):
    _fields_ = [("seqNumber", ctypes.c_uint64), ("func", ctypes.c_char_p), ("sendBuff", ctypes.c_void_p),
                ("recvBuff", ctypes.c_void_p), ("count", ctypes.c_size_t), ("root", ctypes.c_int),
                ("datatype", ctypes.c_char_p), ("nChannels", ctypes.c_uint8), ("nWarps", ctypes.c_uint8),
                ("algo", ctypes.c_char_p), ("proto", ctypes.c_char_p), ("parentGroup", ctypes.c_void_p)]


class KernelCh(ctypes.Structure):
    _fields_ = [("channelId", ctypes.c_uint8), ("pTimer", ctypes.c_uint64)]


class ProxyOp(ctypes.Structure):  # the union's other members, for its size
    _fields_ = [("pid", ctypes.c_int), ("channelId", ctypes.c_uint8), ("peer", ctypes.c_int),
                ("nSteps", ctypes.c_int), ("chunkSize", ctypes.c_int), ("isSend", ctypes.c_int)]


class Union(ctypes.Union):
    _fields_ = [("coll", Coll), ("kernelCh", KernelCh), ("proxyOp", ProxyOp)]


class Descr(ctypes.Structure):
    _anonymous_ = ("u",)
    _fields_ = [("type", ctypes.c_uint64), ("parentObj", ctypes.c_void_p), ("rank", ctypes.c_int), ("u", Union)]


class StateArgs(ctypes.Union):
    _fields_ = [("kernelCh", ctypes.c_uint64), ("transSize", ctypes.c_size_t)]


INIT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint64, ctypes.POINTER(ctypes.c_int),
                        ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p)
START = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(Descr))
STOP = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
STATE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(StateArgs))


class Profiler(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("init", INIT), ("startEvent", START), ("stopEvent", STOP),
                ("recordEventState", STATE), ("finalize", STOP)]


class Nccl:
    """Calls the plugin as NCCL does for one communicator."""

    def __init__(self, path: Path, comm: int = 0xABC) -> None:
        self.lib = ctypes.CDLL(str(path))
        self.prof = Profiler.in_dll(self.lib, "ncclProfiler_v5")
        self.mask = ctypes.c_int(0)
        self.ctx = ctypes.c_void_p()
        assert self.prof.init(ctypes.byref(self.ctx), comm, ctypes.byref(self.mask), b"", 1, 2, 0, None) == 0

    def all_reduce(self, gpu_spans, func=b"AllReduce", count=1024, stop_host_first=True):
        """One collective on len(gpu_spans) channels, each (start, end) in GPU ns."""
        d = Descr(type=COLL)
        d.coll.func, d.coll.count, d.coll.nChannels = func, count, len(gpu_spans)
        handle = ctypes.c_void_p()
        self.prof.startEvent(self.ctx, ctypes.byref(handle), ctypes.byref(d))
        if stop_host_first:  # NCCL stops the host event once the kernel is launched
            self.prof.stopEvent(handle)
        chans = []
        for ch, (start, _) in enumerate(gpu_spans):
            k = Descr(type=KERNEL_CH, parentObj=handle)
            k.kernelCh.channelId, k.kernelCh.pTimer = ch, start
            h = ctypes.c_void_p()
            self.prof.startEvent(self.ctx, ctypes.byref(h), ctypes.byref(k))
            chans.append(h)
        for h, (_, end) in zip(chans, gpu_spans):
            self.prof.recordEventState(h, KERNEL_CH_STOP, ctypes.byref(StateArgs(kernelCh=end)))
            self.prof.stopEvent(h)
        if not stop_host_first:
            self.prof.stopEvent(handle)
        return handle


@pytest.fixture
def plugin(tmp_path):
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler: the plugin is not built here (ddptop says so in the run)")
    path, why = nccl_plugin.build(tmp_path, environ={})
    assert path is not None, why
    return path


def test_the_layout_read_is_ncclS_v5():
    assert Descr.u.offset == 24 and Coll.nChannels.offset == 56 and KernelCh.pTimer.offset == 8
    assert "__attribute__" in nccl_plugin.SOURCE.read_text()  # ships with the package


def test_an_all_reduce_kernel_time_is_its_first_channel_start_to_last_channel_end(plugin):
    nccl = Nccl(plugin)
    assert nccl.mask.value == COLL | KERNEL_CH  # the events it asks NCCL for
    clock, why = KernelClock.open({"NCCL_PROFILER_PLUGIN": str(plugin)})
    assert clock is not None and why == "" and clock.loaded()
    issued = time.monotonic()
    nccl.all_reduce([(1_000_000, 1_150_000), (1_010_000, 1_170_000)])  # 170 us from first start
    nccl.all_reduce([(2_000_000, 2_100_000)], func=b"AllGather")  # not an all-reduce: not kept
    nccl.all_reduce([(3_000_000, 3_020_000)] * 3, stop_host_first=False)
    clock.drain()  # what NcclTimes does once per read of a step's all-reduces
    ms, comm = clock.kernel_ms(issued, None)
    assert ms == pytest.approx(0.170) and comm == 0xABC
    assert clock.kernel_ms(issued, comm)[0] == pytest.approx(0.020)
    assert clock.kernel_ms(issued, comm) == (None, comm) and clock.missed == 1 and clock.matched == 2
    assert clock.dropped() == 0


def test_the_cost_ab_switches_the_kernel_events_off_and_on(plugin):
    nccl = Nccl(plugin)
    clock, _ = KernelClock.open({"NCCL_PROFILER_PLUGIN": str(plugin)})
    clock.enable(False)
    assert nccl.mask.value == 0  # NCCL reads it at every collective call
    clock.enable(True)
    assert nccl.mask.value == COLL | KERNEL_CH


def test_a_collective_whose_channels_have_not_all_ended_is_not_read(plugin):
    nccl = Nccl(plugin)
    clock, _ = KernelClock.open({"NCCL_PROFILER_PLUGIN": str(plugin)})
    d = Descr(type=COLL)
    d.coll.func, d.coll.nChannels = b"AllReduce", 2
    handle = ctypes.c_void_p()
    nccl.prof.startEvent(nccl.ctx, ctypes.byref(handle), ctypes.byref(d))
    k = Descr(type=KERNEL_CH, parentObj=handle)
    k.kernelCh.channelId, k.kernelCh.pTimer = 0, 5
    h = ctypes.c_void_p()
    nccl.prof.startEvent(nccl.ctx, ctypes.byref(h), ctypes.byref(k))
    nccl.prof.recordEventState(h, KERNEL_CH_STOP, ctypes.byref(StateArgs(kernelCh=9)))
    clock.drain()
    assert clock.kernel_ms(time.monotonic() - 0.01, None) == (None, None)


def test_no_plugin_says_why():
    assert KernelClock.open({}) == (None, "ddptop's NCCL profiler plugin was not built for this run")
    why = "no C compiler (cc) to build ddptop's NCCL profiler plugin"
    assert KernelClock.open({protocol.ENV_NCCL_PLUGIN_WHY: why}) == (None, why)
    clock, why = KernelClock.open({"NCCL_PROFILER_PLUGIN": "/nonexistent/libnccl-profiler.so"})
    assert clock is None and "another profiler plugin" in why


def test_a_record_is_matched_to_the_all_reduce_issued_just_before_it():
    q = collections.deque
    by_comm = {1: q([(9.0, 5.0), (10.0001, 0.2), (10.02, 0.3)]), 2: q([(10.00005, 7.0)])}
    # the nearest record decides the communicator, once; older ones of it are dropped
    assert match(by_comm, 10.0, None) == (7.0, 2)
    assert match(by_comm, 10.0, 1) == (0.2, 1) and len(by_comm[1]) == 1
    assert match(by_comm, 10.01, 1) == (0.3, 1)
    assert match(by_comm, 10.5, 1) is None  # nothing left in the window
    by_comm = {1: q([(11.0, 1.0)])}
    assert match(by_comm, 10.0, 1) is None and len(by_comm[1]) == 1  # too far ahead: kept
    assert kernel_clock.WINDOW_S < 1.0


def test_the_launcher_hands_the_plugin_to_nccl_or_says_why_not(tmp_path, plugin, monkeypatch):
    def env(path=None, why="", **kw):
        return build_plan(RunConfig(**kw), tmp_path, "unix:/x", "t", "r", base_env={},
                          nccl_plugin=(path, why)).env
    assert env(plugin, nccl_timing=True)["NCCL_PROFILER_PLUGIN"] == str(plugin)
    assert env(None, "no C compiler", nccl_timing=True)[protocol.ENV_NCCL_PLUGIN_WHY] == "no C compiler"
    assert nccl_plugin.build_for(RunConfig(nccl_timing=False), tmp_path) == (None, "")
    monkeypatch.setattr(nccl_plugin, "NVIDIA_DEVICE", str(tmp_path / "no-such-device"))
    assert nccl_plugin.build_for(RunConfig(nccl_timing=True), tmp_path) == (None, "")  # gloo: nothing to build
    monkeypatch.setattr(nccl_plugin, "NVIDIA_DEVICE", str(tmp_path))
    assert nccl_plugin.build_for(RunConfig(), tmp_path / "default") == (None, "")  # off by default (issue 42)
    built, _ = nccl_plugin.build_for(RunConfig(nccl_timing=True), tmp_path / "gpu")
    assert built is not None and built.parent == tmp_path / "gpu" / "nccl"
    kept = nccl_plugin.build(tmp_path, environ={"NCCL_PROFILER_PLUGIN": "/opt/inspector.so"})
    assert kept[0] is None and "its own NCCL profiler plugin" in kept[1]
    broken = nccl_plugin.build(tmp_path / "b", environ={"CC": "/nonexistent/cc"})
    assert broken[0] is None and "could not build" in broken[1]
