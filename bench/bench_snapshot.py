"""Viewer snapshot benchmark: the cost of the supervisor's snapshot of a 64-rank run (JSON,
ddptop.viewer_wire.state_codec) next to the pickle the viewer protocol used before (protocol 1), and
of reading it back on the viewer's side.

    .venv/bin/python bench/bench_snapshot.py [--ranks 64] [--reps 15]

full  = the first snapshot a viewer gets (whole logs: 2000 lines per rank, 256 step records
        per rank, 120 GPU samples of 8 GPUs, NCCL report, topology, advice, a capture)
tick  = a snapshot half a second later to a viewer that had the last one: 5 new steps on
        every rank, one GPU sample, one throughput point, one rank's log grew by a line.
        Pickle sent the whole state less the unchanged logs; JSON sends only what changed.
Times are the best of --reps (the box may be shared), ms of wall time.
"""

from __future__ import annotations

import argparse
import collections
import io
import pickle
import random
import sys
import time
from pathlib import Path

from ddptop.analysis import nccl
from ddptop.analysis.advisor import advise_run
from ddptop.analysis.capture import Capture
from ddptop.hw import gpu
from ddptop.model.config import RunConfig, preset_config
from ddptop.model.report import table
from ddptop.model.state import LOG_LINES, RECENT, RunState, Stall
from ddptop.viewer_wire import state_codec
from ddptop.viewer_wire import viewer_protocol as vp
from ddptop.wire.protocol import Hello, Steps

NCCL_LOG = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "nccl" / "h200x4_nvlink_info.log"


def gpu_sample(t: float, n_gpus: int) -> gpu.GpuSample:
    return gpu.GpuSample(t=t, available=True, reason="NVML available", gpus=tuple(
        gpu.GpuStat(i, "NVIDIA H200", f"GPU-{i}", f"00000000:{i:02X}:00.0", 97, 60 << 30, 141 << 30, 612.5,
                    700.0, 61, 1980, 1500, None, 18, int(t * 1000), int(t * 999), (gpu.GpuProcess(20000 + i, 60 << 30),))
        for i in range(n_gpus)))


def record(step: int, t: float, rng: random.Random, slow: float) -> dict[str, float]:
    data, fwd, bwd, opt = rng.uniform(1, 3), rng.uniform(25, 30) * slow, rng.uniform(50, 60) * slow, rng.uniform(3, 5)
    rec: dict[str, float] = {"step": step, "t": t, "data_ms": data, "forward_ms": fwd, "backward_ms": bwd,
                             "optimizer_ms": opt, "step_ms": data + fwd + bwd + opt, "samples": 32}
    if step % 4 == 0:  # the GPU comm timer reads its events every few steps
        rec.update(comm_ms=rng.uniform(20, 30), exposed_comm_ms=rng.uniform(2, 8), comm_bytes=1.2e9, buckets=4)
    return rec


def busy_state(n_ranks: int, n_gpus: int = 8) -> RunState:
    """A run some minutes in: full logs and rings, every optional part present. Stdlib only,
    so it runs on a bare machine: PYTHONPATH=. python3 bench/bench_snapshot.py"""
    now = time.time()
    rng = random.Random(0)
    config = preset_config("overlap", RunConfig(nproc=n_ranks, steps=10_000, warmup=5))
    state = RunState(run_id="20260101-120000-overlap-bench", config=config, world_size=n_ranks,
                     warmup=5, started_at=now - 600.0, status="running")
    for r in range(n_ranks):
        state.apply(Hello(rank=r, local_rank=r % 8, world_size=n_ranks, host=f"node{r // 8}", pid=20000 + r,
                          token="", device=f"cuda:{r % 8}", backend="nccl", model="vit_l_32", torch="2.11",
                          nccl="2.28.9"), now)
        slow = 1.25 if r == 1 else 1.0
        state.apply(Steps(rank=r, records=[record(step, now - (RECENT - step) * 0.09, rng, slow)
                                           for step in range(RECENT)]), now)
    for i in range(900):
        state.history.append((i * 0.5, 10.5 + rng.uniform(-0.5, 0.5)))
    for r in range(-1, n_ranks):
        for i in range(LOG_LINES):
            state.add_log(r, f"node{r // 8}:{20000 + r}:{20000 + r} [{r % 8}] NCCL INFO Channel {i % 32:02d}/0 : "
                             f"{r} -> {(r + 1) % n_ranks} via P2P/CUMEM/read {i}")
    for k in range(120):
        state.gpu = gpu_sample(now - 120 + k, n_gpus)
        state.gpu_history.append(state.gpu)
    others = range(n_gpus)
    state.topology = gpu.topology_from_readings([gpu.TopoReading(
        i, "NVIDIA H200", f"00000000:{i:02X}:00.0", (1,) * 18, (None,) * 18, ancestor={j: 30 for j in others if j != i},
        p2p_nvlink={j: 0 for j in others if j != i}, cpu_affinity="0-63", numa_affinity="0", pcie_gen=5,
        pcie_width=16) for i in others])
    state.nccl = nccl.parse_lines(NCCL_LOG.read_text().splitlines())
    state.advice = advise_run(state.summary(), state.nccl, state.topology)
    state.captures[1] = Capture(1, 20, 3, "torch", "/runs/x/captures/1", status="done",
                                ranks=dict.fromkeys(range(n_ranks), "written"),
                                files={r: [f"/runs/x/captures/1/rank{r}.json.gz"] for r in range(n_ranks)},
                                summary={"ranks": {str(r): {"comm_ms": 25.0, "step_ms": [90.1, 91.2, 89.9],
                                                            "top": [{"name": f"k{i}", "ms": 1.5} for i in range(10)]}
                                                   for r in range(n_ranks)}, "comm_ms_mean": 25.0})
    state.stall = Stall(since=now - 30, bound_s=10.0, last_steps=dict.fromkeys(range(n_ranks), 255), suspects=[1],
                        process_status=dict.fromkeys(range(n_ranks), "running"), cleared_at=now - 5)
    state.proc_stats = {20000 + r: (99.5, 3 << 30) for r in range(n_ranks)}
    return state


def tick(state: RunState, step: int) -> None:
    now = time.time()
    rng = random.Random(step)
    for _ in range(5):
        for r in state.ranks:
            state.apply(Steps(rank=r, records=[record(step, now, rng, 1.0)]), now)
        step += 1
    state.gpu = gpu_sample(now, len(state.gpu.gpus))
    state.gpu_history.append(state.gpu)
    state.history.append((now - state.started_at, 10.9))
    state.add_log(0, f"step {step} loss 1.234")


# --- protocol 1, for comparison: a pickle, loaded by a loader that builds ddptop classes only


class _Loader(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # noqa: ANN201
        if module == "collections" and name in ("deque", "Counter"):
            return getattr(collections, name)
        if module.startswith("ddptop."):
            return getattr(sys.modules[module], name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def pickle_frame(state: RunState, logs: dict) -> bytes:  # noqa: ANN001
    every, state.logs = state.logs, logs
    try:
        return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    finally:
        state.logs = every


def best(fn, reps: int) -> tuple[float, object]:  # noqa: ANN001
    times, out = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1000, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--reps", type=int, default=15)
    args = p.parse_args()
    state = busy_state(args.ranks)
    rows = []

    # full snapshots
    pk_ms, pk = best(lambda: pickle_frame(state, state.logs), args.reps)
    js_ms, js = best(lambda: vp.dump_state(state), args.reps)
    pk_load, _ = best(lambda: _Loader(io.BytesIO(pk)).load(), args.reps)
    js_load, base = best(lambda: vp.load_state(js), args.reps)
    rows.append(("full", f"{pk_ms:.1f}", f"{js_ms:.1f}", f"{len(pk) / 1e6:.2f}", f"{len(js) / 1e6:.2f}",
                 f"{pk_load:.1f}", f"{js_load:.1f}"))

    # a tick later
    before = state_codec.marks(state)
    logs_before = {r: (len(x), id(x[-1])) for r, x in state.logs.items()}
    tick(state, 256)
    changed = {r: x for r, x in state.logs.items() if logs_before.get(r) != (len(x), id(x[-1]))}
    pk_ms, pk = best(lambda: pickle_frame(state, changed), args.reps)
    js_ms, js = best(lambda: vp.dump_state(state, before), args.reps)
    pk_load, _ = best(lambda: _Loader(io.BytesIO(pk)).load(), args.reps)
    js_load, back = best(lambda: vp.load_state(js, base), args.reps)
    assert back.summary() == state.summary() and list(back.gpu_history) == list(state.gpu_history)
    rows.append(("tick", f"{pk_ms:.1f}", f"{js_ms:.1f}", f"{len(pk) / 1e6:.2f}", f"{len(js) / 1e6:.3f}",
                 f"{pk_load:.1f}", f"{js_load:.1f}"))
    print(f"{args.ranks} ranks, best of {args.reps}")
    print(table(("snapshot", "pickle ms", "json ms", "pickle MB", "json MB", "unpickle ms", "json load ms"), rows))


if __name__ == "__main__":
    main()
