"""Compiled graphs unchanged (issue 43): under `torch.compile(DDP(model))` ddptop's forward
hooks move from the DDP module to torch.compile's wrapper, outside the compiled region, so the
compiler traces nothing of ddptop's. tests/scripts/compiled_ddp.py prints each rank's graph
breaks, compiled frames and recompiles (torch._dynamo.utils.counters; the aot_eager backend:
dynamo's counts do not depend on it, and no C++ compiler runs). Before: 13 graph breaks and 88
frames against plain torchrun's 3 and 44, and a compiler warning on every rank's stderr."""

import pytest
from test_errors_as_torchrun import masked
from test_script_truth import run_both, summary_of

pytestmark = pytest.mark.e2e


def test_torch_compile_of_ddp_compiles_as_under_torchrun_and_is_still_measured(tmp_path):
    ours, our_out, theirs, their_out = run_both(tmp_path, "compiled_ddp.py", ["--steps", "12"])
    assert ours.returncode == theirs.returncode == 0, ours.stdout[-2000:]
    assert sorted(our_out) == sorted(their_out) == [0, 1]
    for rank in (0, 1):
        assert our_out[rank][0] == their_out[rank][0], (our_out[rank][0], their_out[rank][0])
        assert "graph breaks 3," in our_out[rank][0] and "recompiles 0" in our_out[rank][0], our_out[rank][0]
        assert masked(our_out[rank][1]) == masked(their_out[rank][1]), (our_out[rank][1], their_out[rank][1])
    s = summary_of(ours.stdout)
    for r in s["ranks"]:  # timed from outside the compiled region
        assert r["steps"] == 12 and r["phases_ms"]["forward"] > 0 and r["phases_ms"]["backward"] > 0, r
