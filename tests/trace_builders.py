"""Synthetic torch.profiler traces (Chrome JSON as the profiler writes it) for the capture
analyses' tests: kernels with their CUDA runtime launches, NCCL collectives named by their
args, gloo's CPU collectives. Times in us."""

from __future__ import annotations

from typing import Any


class GpuTrace:
    def __init__(self, rank: int, world: int = 2, device: int = 0, cpu_tid: int = 100) -> None:
        self.rank, self.world, self.device, self.tid = rank, world, device, cpu_tid
        self.events: list[dict[str, Any]] = []
        self._corr = 0

    def kernel(self, name: str, start: float, dur: float, stream: int = 7, launch: float | None = None,
               cat: str = "kernel", **args: Any) -> GpuTrace:
        self._corr += 1
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.device, "tid": stream,
                            "ts": start, "dur": dur, "args": {"device": self.device, "stream": stream,
                                                              "correlation": self._corr, **args}})
        if launch is not None:
            self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
                                "tid": self.tid, "ts": launch, "dur": 5.0,
                                "args": {"correlation": self._corr}})
        return self

    def allreduce(self, start: float, dur: float, launch: float | None = None, nelems: int = 1000,
                  group: str = "0") -> GpuTrace:
        return self.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", start, dur, stream=20, launch=launch,
                           **{"Collective name": "allreduce", "Process Group Name": group,
                              "In msg nelems": nelems, "Out msg nelems": nelems})

    def cpu(self, name: str, start: float, dur: float, cat: str = "cpu_op", tid: int | None = None,
            **args: Any) -> GpuTrace:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": self.tid if tid is None else tid,
                            "ts": start, "dur": dur, "args": args})
        return self

    def trace(self) -> dict[str, Any]:
        return {"distributedInfo": {"rank": self.rank, "world_size": self.world, "backend": "nccl"},
                "traceEvents": list(self.events)}
