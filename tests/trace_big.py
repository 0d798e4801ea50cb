"""A large synthetic torch.profiler trace shaped like a real one (ddptop's ViT-L/32 capture on
an H100: per step, CPU ops with their args, CUDA launches, kernels with Kineto's full args,
an NCCL all-reduce named by its args, flow events), written event by event so making it costs
no memory, with the figures its summary must show."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

STEP_US = 10_000.0
CPU_OPS = 60  # a step's CPU ops (a real trace has ~53% cpu_op events)
KERNELS = 15  # compute kernels a step, each 400 us from 100 us into the step, 500 us apart
GEMM = "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_bf16_128x128_32x3_nn_align8>(cutlass_80_tensorop_s1688gemm_bf16_128x128_32x3_nn_align8::Params)"


def _step(i: int, corr: int) -> list[dict[str, Any]]:
    t0 = i * STEP_US
    ev: list[dict[str, Any]] = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 1300,
                                 "tid": 1300, "ts": t0, "dur": STEP_US - 1, "args": {"External id": corr}}]
    for j in range(CPU_OPS):
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::linear" if j % 2 else "aten::addmm", "pid": 1300,
                   "tid": 1300, "ts": t0 + 5 + j * 150, "dur": 120.5,
                   "args": {"External id": corr + j, "Record function id": 0, "Sequence number": corr + j,
                            "Fwd thread id": 0, "Ev Idx": j, "Input Dims": [[32, 1024], [1024, 1024], []],
                            "Input type": ["c10::BFloat16", "c10::BFloat16", ""]}})
    for k in range(KERNELS + 1):
        c = corr + k
        nccl = k == KERNELS
        start = t0 + (9000.0 if nccl else 100.0 + 500.0 * k)
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1300, "tid": 1300,
                   "ts": start - 60, "dur": 6.5, "args": {"External id": c, "cbid": 211, "correlation": c}})
        args: dict[str, Any] = {"External id": c, "queued": 0, "device": 0, "context": 1, "stream": 20 if nccl else 7,
                                "correlation": c, "registers per thread": 232, "shared memory": 81920,
                                "blocks per SM": 0.484848, "warps per SM": 3.878788, "grid": [64, 1, 1],
                                "block": [256, 1, 1], "est. achieved occupancy %": 6}
        if nccl:
            args.update({"Collective name": "allreduce", "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20,
                         "Process Group Name": "0", "Process Group Ranks": "[0, 1]"})
        ev.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL" if nccl else GEMM,
                   "pid": 0, "tid": 20 if nccl else 7, "ts": start, "dur": 800.0 if nccl else 400.0, "args": args})
        ev.append({"ph": "s", "id": c, "pid": 1300, "tid": 1300, "ts": start - 60, "cat": "ac2g", "name": "ac2g"})
        ev.append({"ph": "f", "id": c, "pid": 0, "tid": 7, "ts": start, "cat": "ac2g", "name": "ac2g", "bp": "e"})
    return ev


def write_big_trace(path: Path, megabytes: float) -> dict[str, Any]:
    """Write steps until the file holds `megabytes` MB; what its summary must say."""
    limit, steps = megabytes * 1e6, 0
    with open(path, "w") as f:
        f.write('{"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2},\n'
                '"traceEvents": [\n')
        while f.tell() < limit:
            if steps:
                f.write(",\n")
            f.write(",\n".join(json.dumps(e) for e in _step(steps, steps * 100)))
            steps += 1
        f.write('\n], "traceName": "big"}\n')
    window_us = (steps - 1) * STEP_US + 9000.0 + 800.0 - 100.0
    return {"steps": steps, "compute": steps * KERNELS, "comm": steps, "window_ms": round(window_us / 1000.0, 3),
            "comm_ms": round(steps * 0.8, 3)}
