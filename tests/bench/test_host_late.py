"""bench/investigations/host_late.py's reading of a run: the late host's sign from the step
records, and each rank's main thread from consecutive /proc readings (issue 44)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("host_late", ROOT / "bench" / "investigations" / "host_late.py")
hl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hl)


def test_the_rank_whose_data_phase_is_longer_than_the_others_is_the_late_host(tmp_path) -> None:
    lines = [json.dumps({"rank": r, "step": s, "step_ms": 20.0, "data_ms": 0.55 if r == 2 else 0.01})
             for s in range(20) for r in range(4)]
    (tmp_path / "steps.jsonl").write_text("\n".join(lines) + "\nnot json\n")
    assert hl.data_excess(tmp_path, warmup=10) == {0: 0.0, 1: 0.0, 2: 0.54, 3: 0.0}


def test_a_main_thread_beside_a_busy_sibling_and_its_share_of_a_cpu() -> None:
    """Rank 0's main thread (tid = its pid) ran 0.9 s of each second on CPU 0, whose sibling
    CPU 32 ran its busy proxy thread; rank 1's main thread ran alone on CPU 1."""
    def reading(t: float) -> tuple[float, dict, dict[int, float]]:
        threads = {0: {100: ("python", 0.9 * t, 0), 101: ("nccl proxy", 1.0 * t, 32)},
                   1: {200: ("python", 0.8 * t, 1), 201: ("nccl proxy", 0.0, 33)}}
        return t, threads, {0: 2000.0, 1: 3000.0}

    rows = hl.summarize([reading(t) for t in (1.0, 2.0, 3.0)], {0: 100, 1: 200}, {0: {32}, 1: {33}})
    assert rows[0] == {"main_cpu_share": 0.9, "cpus_visited": 1, "mhz": 2000, "sibling_busy_share": 1.0}
    assert rows[1] == {"main_cpu_share": 0.8, "cpus_visited": 1, "mhz": 3000, "sibling_busy_share": 0.0}
