"""A scripted telemetry source for layout tests, snapshots, the UI benchmark and demos: a
RunState filled through its public `apply()` with Hello/Steps records, plus an
NVML-shaped GPU sample, NCCL lines, a topology, a capture and earlier runs on disk
(`fill_views`, `write_earlier_runs`). Never used for a real run."""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from textual.widgets import TabbedContent

from ddptop.analysis.advisor import advise_run
from ddptop.analysis.capture import Capture
from ddptop.analysis.nccl import parse_lines
from ddptop.hw.topology import TopologyMatrix, TopoReading
from ddptop.model.config import RunConfig, preset_config
from ddptop.model.state import RECENT, RunState
from ddptop.run.handle import RunHandle
from ddptop.run.workbench import Workbench
from ddptop.tui.app import DdpTopApp
from ddptop.tui.views import TABS
from ddptop.wire.protocol import Hello, Steps

# 2026-01-01 12:00:00 UTC: the clock of snapshots and README images (nothing in them ages)
SYNTHETIC_NOW = 1_767_268_800.0
RUNS_ROOT = "/scratch/ddptop/runs"  # where the scripted captures say they wrote (no tmp dir)


def _bucket_spans(rec: dict[str, float], buckets: int = 4) -> dict[int, tuple[tuple[float, float], ...]]:
    """Four buckets going out one after another, the last completing when backward returns
    and handed over `exposed_comm_ms` before that (what the rank side measures)."""
    end = rec["data_ms"] + rec["forward_ms"] + rec["backward_ms"]
    each = rec["comm_ms"] / buckets
    done = [end - (buckets - 1 - i) * each for i in range(buckets)]
    spans = [(d - each * 1.5, d) for d in done[:-1]] + [(end - rec["exposed_comm_ms"], end)]
    return {int(rec["step"]): tuple((round(a, 3), round(b, 3)) for a, b in spans)}


def synthetic_state(n_ranks: int, steps: int = RECENT, slow_rank: int | None = 1,
                    comm: bool = True, seed: int = 0, now: float | None = None,
                    run_id: str = "20260101-120000-overlap-demo", backend: str = "nccl",
                    nodes: int = 1) -> RunState:
    """`nodes` > 1: a multi-node run, the ranks split evenly over that many ddptop nodes."""
    now = time.time() if now is None else now
    rng = random.Random(seed)
    config = preset_config("overlap", RunConfig(nproc=n_ranks, steps=steps * 4, warmup=5))
    state = RunState(run_id=run_id, config=config, world_size=n_ranks,
                     warmup=config.warmup, started_at=now - 60.0, nnodes=nodes)
    def device(r: int) -> str:
        return f"cuda:{r % 8}" if backend == "nccl" else "cpu"

    per_node = -(-n_ranks // nodes) if nodes > 1 else 8  # one node: a host name per 8 GPUs

    for r in range(n_ranks):
        state.apply(Hello(rank=r, local_rank=r % per_node, world_size=n_ranks, host=f"node{r // per_node}",
                          pid=20000 + r, token="", device=device(r), backend=backend,
                          model="vit_l_32", torch="2.11", nccl="2.28.9",
                          node=r // per_node if nodes > 1 else 0), now)
        records = []
        for step in range(steps):
            slow = 1.25 if r == slow_rank else 1.0
            data, fwd = rng.uniform(1, 3), rng.uniform(25, 30) * slow
            bwd, opt = rng.uniform(50, 60) * slow, rng.uniform(3, 5)
            # the others wait for a slow rank at backward's end, in the all-reduce (DDP's ranks meet there)
            wait = rng.uniform(18, 23) if slow_rank is not None and slow_rank != r and 0 <= slow_rank < n_ranks else 0.0
            rec: dict[str, float] = {"step": step, "t": now - (steps - step) * 0.09,
                                     "data_ms": data, "forward_ms": fwd, "backward_ms": bwd + wait,
                                     "optimizer_ms": opt, "step_ms": data + fwd + bwd + opt + wait,
                                     "samples": 32}
            if comm:
                rec.update(comm_ms=rng.uniform(20, 30) + wait, exposed_comm_ms=rng.uniform(2, 8) + wait,
                           comm_bytes=1.2e9, buckets=4, compressing=0)
            records.append(rec)
        state.apply(Steps(rank=r, records=records, spans=_bucket_spans(records[-1]) if comm else {}), now)
        state.add_log(r, f"[trainer] rank {r}/{n_ranks} {device(r)} backend={backend} model=vit_l_32")
        state.add_log(r, f"node{r // 8}:{20000 + r}:{20000 + r} [{r % 8}] NCCL INFO Channel 00/0 : "
                         f"{r} -> {(r + 1) % n_ranks} via P2P/CUMEM")
    state.add_log(-1, "[ddptop] synthetic state")
    rate = state.live_steps_per_s() or 10.0  # the chart ends where the header's figure is
    for i in range(239):
        state.history.append((i * 0.5, rate * (1 + rng.uniform(-0.04, 0.04))))
    state.history.append((119.5, rate))
    state.status = "running"
    return state


def synthetic_gpu_sample(n_gpus: int, t: float | None = None, util: float = 97.0) -> Any:
    """Shaped like ddptop.hw.gpu.GpuSample (duck-typed)."""
    gpus = tuple(SimpleNamespace(
        index=i, name="NVIDIA H200", util_pct=util, mem_used=60 * 2**30, mem_total=141 * 2**30,
        power_w=612.0, power_limit_w=700.0, temp_c=61, sm_clock_mhz=1980,
        pcie_tx_kbs=1500, pcie_rx_kbs=2100, nvlink_active=18,
        nvlink_tx_kib=int((t or 0) * 1e6), nvlink_rx_kib=int((t or 0) * 1e6),
        processes=(SimpleNamespace(pid=20000 + i, used_mem=60 * 2**30),),
    ) for i in range(n_gpus))
    return SimpleNamespace(t=time.time() if t is None else t, gpus=gpus, available=True, reason="",
                           driver="580.95.05")


@dataclass
class StaticSession:
    """A RunHandle whose state is scripted: nothing runs, nothing to stop or capture."""

    state: RunState
    config: RunConfig = field(default_factory=RunConfig)
    run_dir: Path = Path("/nonexistent")
    done: bool = True

    @property
    def run_id(self) -> str:
        return self.state.run_id

    async def run(self) -> RunState:
        return self.state

    def request_stop(self, reason: str = "") -> None:
        pass

    async def request_capture(self, count: int = 3) -> Capture:
        raise RuntimeError("a scripted run has no ranks to capture")


def synthetic_workbench(state: RunState, runs_dir: Path, live: bool = False) -> Workbench:
    """A Workbench whose current run is `state` (start the app with autostart=False); `live`:
    the run reads as still going (nothing runs either way)."""
    config = state.config
    bench = Workbench(config, runs_dir)
    session: RunHandle = StaticSession(state, config, Path(runs_dir) / state.run_id, done=not live)
    bench.sessions.append(session)
    return bench


def fill_views(state: RunState, now: float, gpus: int = 8) -> RunState:
    """What a GPU run fills in that `synthetic_state` leaves empty, so every tab has
    something to lay out: an NVML sample with a short history, NCCL's lines (a ring over
    P2P, one hop over SHM, the network between nodes), the node's NVLink topology, the
    advisor's word on all that, and one finished capture with its trace files."""
    rng = random.Random(7)
    n_gpus = min(gpus, state.world_size)
    state.gpu_history.extend(synthetic_gpu_sample(n_gpus, t=now - 299 + i, util=rng.uniform(80, 99))
                             for i in range(299))  # five minutes, one a second: the GPU tab's charts full
    state.gpu = synthetic_gpu_sample(n_gpus, t=now)
    state.gpu_history.append(state.gpu)
    state.nccl = parse_lines(nccl_lines(state))
    state.topology = TopologyMatrix(
        gpus=tuple(TopoReading(index=i, name="NVIDIA H200", pci_bus_id=f"00000000:{0x18 + 16 * i:02X}:00.0",
                               nvlink_states=(1,) * 18) for i in range(n_gpus)),
        links=tuple(tuple("X" if i == j else "NV18" for j in range(n_gpus)) for i in range(n_gpus)))
    state.advice = advise_run(state.summary(), state.nccl, state.topology, env={})
    state.captures[1] = synthetic_capture(state)
    for r in sorted(state.ranks)[:2]:  # a line longer than any terminal, as torch prints them
        state.add_log(r, "[W1231 11:59:02.962203732 Utils.hpp:137] Warning: Environment variable "
                         "TORCH_NCCL_TRACE_BUFFER_SIZE is deprecated; use TORCH_FR_BUFFER_SIZE instead "
                         "(function operator())")
    _fill_memory(state)
    return state


def _fill_memory(state: RunState) -> None:
    """The rank side's memory samples (every 10th step) and each rank's two DataLoader workers."""
    for r, rs in state.ranks.items():
        for rec in rs.recent:
            if int(rec["step"]) % 10 == 0:
                rec.update(mem_allocated_mb=3007.0 + r, mem_reserved_mb=6956.0, mem_peak_mb=6236.0, rss_mb=2396.0)
        if rs.hello is not None:
            workers = [rs.hello.pid + 1000 + 100 * k for k in range(2)]
            state.proc_children[rs.hello.pid] = workers
            state.proc_stats.update({rs.hello.pid: (101.0, 2396 << 20),
                                     **{w: (35.0 + k, (412 + k) << 20) for k, w in enumerate(workers)}})


def nccl_lines(state: RunState) -> list[str]:
    """NCCL_DEBUG=INFO lines as the ranks of `state` would print them (init, ring)."""
    lines, n = [], state.world_size
    hello = {r: rs.hello for r, rs in state.ranks.items() if rs.hello is not None}
    for r, h in sorted(hello.items()):
        lines.append(f"{h.host}:{h.pid}:{h.pid} [{h.local_rank}] NCCL INFO NCCL version 2.28.9+cuda13.0")
        lines.append(f"{h.host}:{h.pid}:{h.pid} [{h.local_rank}] NCCL INFO ncclCommInitRankConfig comm "
                     f"0x{0x38f6e1a0 + r:x} rank {r} nranks {n} cudaDev {h.local_rank} nvmlDev "
                     f"{h.local_rank} busId {0x18 + 16 * h.local_rank:x}0 commId 0x7d4827b048d6e27e "
                     "- Init COMPLETE")
    for r, h in sorted(hello.items()):
        nxt = hello.get((r + 1) % n)
        if nxt is None:
            continue
        via = ("NET/IB/0" if nxt.host != h.host else "SHM/direct/direct" if r == 2 % n
               else "P2P/CUMEM")
        for ch in range(2):
            lines.append(f"{h.host}:{h.pid}:{h.pid} [{h.local_rank}] NCCL INFO Channel {ch:02d}/0 : "
                         f"{r}[{h.local_rank}] -> {(r + 1) % n}[{nxt.local_rank}] via {via}")
    return lines


def synthetic_capture(state: RunState, capture_id: int = 1, start: int = 120) -> Capture:
    """A finished torch.profiler window of 3 steps on every rank, with its summary."""
    out_dir = f"{RUNS_ROOT}/{state.run_id}/captures/{capture_id}"
    ranks = sorted(state.ranks)
    summary: dict[str, Any] = {"comm_ms_mean": 24.8, "open_with": "perfetto", "ranks": {}}
    for r in ranks:
        slow = 1.25 if r == 1 else 1.0
        summary["ranks"][str(r)] = {
            "comm_ms": 74.1 + r % 3, "overlap_ms": 66.0, "steps": [start, start + 1, start + 2],
            "step_ms": [round(88.2 * slow, 1), round(87.9 * slow, 1), round(88.6 * slow, 1)],
            "source": "gpu", "window_ms": 265.0 * slow, "busy_ms": 251.0, "idle_ms": 14.0, "idle_pct": 5.3,
            "compute_ms": 180.2, "compute_pct": 68.0, "comm_pct": 28.0, "memory_ms": 3.1, "memory_pct": 1.2,
            "streams": [{"stream": 7, "host_wait_ms": 9.8, "kernel_wait_ms": 2.9, "other_wait_ms": 1.3}],
            "top": [{"name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                     "kind": "comm", "ms": 74.1, "count": 12, "mean_ms": 6.175, "std_ms": 0.41,
                     "min_ms": 5.402, "max_ms": 6.884}],
        }
    return Capture(capture_id, start, 3, "torch", out_dir, status="done",
                   ranks=dict.fromkeys(ranks, "written"),
                   files={r: [f"{out_dir}/rank{r}.trace.json.gz"] for r in ranks}, summary=summary)


# Earlier runs of the same model, as a runs directory holds them: (run id, preset, changes,
# steps/s, status). The last has no summary (killed hard): the table says so.
EARLIER_RUNS: tuple[tuple[str, str, dict[str, Any], float | None, str], ...] = (
    ("20251231-093000-baseline", "baseline", {}, 6.12, "completed"),
    ("20251231-101500-custom", "bf16", {"preset": "custom", "bucket_cap_mb": 50.0,
                                         "nccl_env": {"NCCL_ALGO": "Ring"}}, 9.87, "completed"),
    ("20251231-110000-powersgd", "powersgd", {}, 7.40, "stopped"),
    ("20251231-113000-fp16", "fp16", {}, None, "no summary"),
)


def write_earlier_runs(runs_dir: Path, n_ranks: int) -> None:
    """Earlier runs' summary.json (config.json alone for one), so the runs tab compares."""
    for run_id, preset, changes, rate, status in EARLIER_RUNS:
        run_dir = Path(runs_dir) / run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        config = preset_config(preset, RunConfig(nproc=n_ranks, steps=1024, warmup=5)).with_changes(**changes)
        if rate is None:
            (run_dir / "config.json").write_text(json.dumps({**config.to_dict(), "_launch": {"run_id": run_id}}))
            continue
        (run_dir / "summary.json").write_text(json.dumps({
            "run_id": run_id, "preset": config.preset, "config": config.to_dict(),
            "world_size": n_ranks, "backend": "nccl", "model": "vit_l_32", "status": status,
            "steps_per_s": rate, "samples_per_s": rate * 32 * n_ranks, "step_ms_p50": 1000 / rate,
        }))


def snapshot_app(n_ranks: int, runs_dir: Path, now: float = SYNTHETIC_NOW, **state_kw: Any) -> DdpTopApp:
    """The app on a scripted run of `n_ranks` (8 GPUs a node) with every view filled and its
    clock stopped at `now`: what the snapshot tests and scripts/snapshots.py draw, the same
    bytes every time. Refreshes only when told (`app.refresh_views()`)."""
    state_kw.setdefault("nodes", max(1, n_ranks // 8))
    return app_on_state(fill_views(synthetic_state(n_ranks, now=now, **state_kw), now), runs_dir, now)


def app_on_state(state: RunState, runs_dir: Path, now: float = SYNTHETIC_NOW) -> DdpTopApp:
    """snapshot_app on a state already made (and filled): tests that draw one big state
    several times make it once. The app only reads it."""
    write_earlier_runs(runs_dir, state.world_size)
    bench = synthetic_workbench(state, runs_dir, live=True)  # as the state says: stop and capture offered
    return DdpTopApp(bench, autostart=False, refresh_s=3600, clock=lambda: now)


async def show_tab(app: DdpTopApp, pilot: Any, tab: str) -> None:
    """Open `tab` (by its key, as a user would) and show the views twice: the first
    refresh sizes them (table heights, column sets), the second draws them at that size."""
    await pilot.press(str(TABS.index(tab) + 1))
    for _ in range(200):  # the key's tab switch is a message: on a loaded machine it may not be handled yet
        if app.query_one(TabbedContent).active == tab:
            break
        await pilot.pause(0.01)
    for _ in range(2):
        app.refresh_views(force_runs=True)
        await pilot.pause()
        await pilot.wait_for_scheduled_animations()
    # a table whose rows just widened its columns redraws its header on a later refresh: on a
    # loaded machine the picture could be taken between the two (the runs tab, seen in CI, also
    # after one forced refresh): refreshed until two pictures in a row are the same
    previous = None
    for _ in range(20):
        app.screen.refresh(layout=True)
        await pilot.pause(0.05)
        await pilot.wait_for_scheduled_animations()
        shot = app.export_screenshot()
        if shot == previous:
            break
        previous = shot
