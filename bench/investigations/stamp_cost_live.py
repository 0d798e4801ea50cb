"""What a GPU stamp costs the host inside a real training script, and why (issue 27).

bench/investigations/clock_cost.py measured an event record at ~1.7 us in a quiet loop; inside the HF
Trainer under ddptop the same record cost ~16 us a call (2026-11-26, 2x H200). This runs
bench/hf_train.py unchanged but for one TrainerCallback that, at the end of every optimizer
step after warmup, times N calls of each candidate from the script's main thread:

    torch record       Event.record(stream) of an event already created (ddptop's stamp)
    driver, GIL held   cuEventRecord on the same handles through ctypes.PyDLL
    driver, GIL freed  the same through ctypes.CDLL (drops and retakes the GIL, as torch does)
    sleep(0)           drops and retakes the GIL, nothing else: the handoff alone
    query, elapsed     Event.query(), Event.elapsed_time()
    python call        an empty Python call (the floor)

If the driver call with the GIL held is cheap and sleep(0) is not, the cost is the GIL's
handoff to another thread, not CUDA. Medians over steps of us per call, per rank, written as
JSON lines to $STAMP_OUT (default stamp_cost_live.jsonl), with the process's Python threads.

    ddptop --nproc 2 --headless -- python bench/investigations/stamp_cost_live.py --steps 60
    torchrun --standalone --nproc-per-node 2 bench/investigations/stamp_cost_live.py --steps 60

Question: inside the HF Trainer, is a stamp's host cost CUDA's or the GIL's handoff?
Answer (2026-11-26, 2x H200): not the CUDA call: Event.record 2.7 us, cuEventRecord 1.7-2.1 us,
against ~22 us a hook call; ddptop takes fewer stamps since. `bash bench/gpu_check.sh stampcost`
runs it.
Quoted in: docs/BENCHMARKS.md, "fewer stamps; the method's limit on these scripts".
"""

import ctypes
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: hf_train
import hf_train  # noqa: E402 - sets the HF offline variables before transformers is imported
import torch  # noqa: E402
import transformers  # noqa: E402

CALLS = 20


class StampProbe(transformers.TrainerCallback):
    def __init__(self, warmup: int = 5) -> None:
        self.warmup = warmup
        self.times: dict[str, list[float]] = {}
        self.ready = False

    def _setup(self) -> None:
        self.stream = torch.cuda.current_stream()
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(CALLS)]
        for e in self.events:
            e.record(self.stream)  # created now: later records reuse them
        torch.cuda.synchronize()
        held, freed = ctypes.PyDLL("libcuda.so.1"), ctypes.CDLL("libcuda.so.1")
        s = ctypes.c_void_p(self.stream.cuda_stream)
        handles = [ctypes.c_void_p(e.cuda_event) for e in self.events]
        it = iter(range(1 << 62))
        self.cases = {
            "torch record": lambda: self.events[next(it) % CALLS].record(self.stream),
            "driver record, GIL held": lambda: held.cuEventRecord(handles[next(it) % CALLS], s),
            "driver record, GIL freed": lambda: freed.cuEventRecord(handles[next(it) % CALLS], s),
            "sleep(0)": lambda: time.sleep(0),
            "query": lambda: self.events[0].query(),
            "elapsed": lambda: self.events[0].elapsed_time(self.events[1]),
            "python call": lambda: None,
        }
        self.ready = True

    def on_step_end(self, args, state, control, **kwargs):
        if not torch.cuda.is_available() or state.global_step <= self.warmup:
            return
        if not self.ready:
            self._setup()
        for name, fn in self.cases.items():
            t = time.perf_counter()
            for _ in range(CALLS):
                fn()
            self.times.setdefault(name, []).append((time.perf_counter() - t) / CALLS * 1e6)

    def on_train_end(self, args, state, control, **kwargs):
        if not self.times:
            return
        row = {"rank": int(os.environ.get("RANK", "0")), "under_ddptop": "DDPTOP_CONFIG" in os.environ,
               "steps": len(next(iter(self.times.values()))),
               "us_per_call": {k: round(statistics.median(v), 2) for k, v in self.times.items()},
               "p90": {k: round(statistics.quantiles(v, n=10)[-1], 2) for k, v in self.times.items() if len(v) > 2},
               "threads": sorted(t.name for t in threading.enumerate()),
               "os_threads": len(os.listdir("/proc/self/task"))}
        with open(os.environ.get("STAMP_OUT", "stamp_cost_live.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    probe = StampProbe()
    original = transformers.Trainer.__init__

    def init(self, *args, **kwargs):
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), probe]
        original(self, *args, **kwargs)

    transformers.Trainer.__init__ = init
    hf_train.Trainer = transformers.Trainer
    hf_train.main()
