"""A scripted telemetry source for layout tests, the UI benchmark and demos: a
RunState filled through its public `apply()` with Hello/Steps records, plus an
NVML-shaped GPU sample. Never used for a real run."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ddptop.analysis.capture import Capture
from ddptop.model.config import RunConfig, preset_config
from ddptop.model.state import RECENT, RunState
from ddptop.run.handle import RunHandle
from ddptop.run.workbench import Workbench
from ddptop.wire.protocol import Hello, Steps


def synthetic_state(n_ranks: int, steps: int = RECENT, slow_rank: int | None = 1,
                    comm: bool = True, seed: int = 0, now: float | None = None,
                    run_id: str = "20260101-120000-overlap-demo", backend: str = "nccl",
                    nodes: int = 1) -> RunState:
    """`nodes` > 1: a multi-node run, the ranks split evenly over that many ddptop nodes."""
    now = time.time() if now is None else now
    rng = random.Random(seed)
    config = preset_config("overlap", RunConfig(nproc=n_ranks, steps=steps * 4, warmup=5))
    state = RunState(run_id=run_id, config=config.to_dict(), world_size=n_ranks,
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
            rec: dict[str, float] = {"step": step, "t": now - (steps - step) * 0.09,
                                     "data_ms": data, "forward_ms": fwd, "backward_ms": bwd,
                                     "optimizer_ms": opt, "step_ms": data + fwd + bwd + opt,
                                     "samples": 32}
            if comm:
                rec.update(comm_ms=rng.uniform(20, 30), exposed_comm_ms=rng.uniform(2, 8),
                           comm_bytes=1.2e9, buckets=4, compressing=0)
            records.append(rec)
        state.apply(Steps(rank=r, records=records), now)
        state.add_log(r, f"[trainer] rank {r}/{n_ranks} {device(r)} backend={backend} model=vit_l_32")
        state.add_log(r, f"node{r // 8}:{20000 + r}:{20000 + r} [{r % 8}] NCCL INFO Channel 00/0 : "
                         f"{r} -> {(r + 1) % n_ranks} via P2P/CUMEM")
    state.add_log(-1, "[ddptop] synthetic state")
    for i in range(240):
        state.history.append((i * 0.5, 10.5 + rng.uniform(-0.5, 0.5)))
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
    return SimpleNamespace(t=time.time() if t is None else t, gpus=gpus, available=True, reason="")


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


def synthetic_workbench(state: RunState, runs_dir: Path) -> Workbench:
    """A Workbench whose current run is `state` (start the app with autostart=False)."""
    config = RunConfig.from_dict(state.config)
    bench = Workbench(config, runs_dir)
    session: RunHandle = StaticSession(state, config, Path(runs_dir) / state.run_id)
    bench.sessions.append(session)
    return bench
