"""NcclTimes: NCCL's own per-collective timing read from a process group's completion hook
(the hook thread's WorkInfo), attributed to the steps whose host window issued them."""

from datetime import timedelta
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
from torch._C._distributed_c10d import OpType  # noqa: E402

from ddptop.rank.comm import NcclTimes  # noqa: E402


class Group:
    def __init__(self, backend="nccl", has_hook=False):
        self.backend, self.hook = backend, None
        self.has_hook = has_hook

    def _register_on_completion_hook(self, hook):
        if self.has_hook:
            raise RuntimeError("ProcessGroupNCCL OnCompletion hook already registered")
        self.hook = hook


def dist_for(group):
    return SimpleNamespace(get_backend=lambda pg: pg.backend)


def info(start_s, dur_ms, op=OpType.ALLREDUCE):
    return SimpleNamespace(op_type=op, time_started=timedelta(seconds=start_s),
                           active_duration=timedelta(milliseconds=dur_ms))


def test_only_where_nccl_times_its_work(monkeypatch):
    monkeypatch.delenv("TORCH_NCCL_ENABLE_TIMING", raising=False)
    assert NcclTimes.attach(dist_for(Group()), Group()) is None  # its hook would abort the communicator
    monkeypatch.setenv("TORCH_NCCL_ENABLE_TIMING", "1")
    assert NcclTimes.attach(dist_for(None), Group("gloo")) is None
    assert NcclTimes.attach(dist_for(None), Group(has_hook=True)) is None
    assert NcclTimes.attach(dist_for(None), SimpleNamespace(backend="nccl")) is None  # an older torch
    group = Group()
    assert NcclTimes.attach(dist_for(group), group) is not None and group.hook is not None


def test_all_reduces_go_to_the_step_that_issued_them_once_a_later_one_is_reported(monkeypatch):
    monkeypatch.setenv("TORCH_NCCL_ENABLE_TIMING", "1")
    group = Group()
    times = NcclTimes.attach(dist_for(group), group)
    for start, dur in ((10.0, 1.0), (10.1, 2.5), (10.2, 0.5)):  # step 0 closes at 10.5
        group.hook(info(start, dur))
    group.hook(info(10.3, 9.0, OpType.BROADCAST))  # not an all-reduce: not gradient communication
    assert not times.reported_after(10.5)
    group.hook(info(10.6, 1.0))  # step 1's first bucket: step 0 is complete
    assert times.reported_after(10.5)
    assert times.take(10.5) == pytest.approx([1.0, 2.5, 0.5])
    assert times.take(10.5) == [] and times.take(11.0) == pytest.approx([1.0])


def test_a_broken_work_info_is_counted_never_raised(monkeypatch):
    monkeypatch.setenv("TORCH_NCCL_ENABLE_TIMING", "1")
    group = Group()
    times = NcclTimes.attach(dist_for(group), group)
    group.hook(SimpleNamespace(op_type=OpType.ALLREDUCE, time_started=None, active_duration=None))
    assert times.errors == 1 and times.take(1e9) == []


def test_nccls_own_timing_is_asked_of_the_ranks_unless_nccl_timing_is_off(tmp_path):
    from ddptop.model.config import RunConfig
    from ddptop.run.launcher import build_plan

    def env(**kw):
        return build_plan(RunConfig(nproc=2, **kw), tmp_path, "unix:/x/hub.sock", "t", "run", base_env={}).env

    assert env()["TORCH_NCCL_ENABLE_TIMING"] == "1"  # default: total comm measured by NCCL itself
    assert "TORCH_NCCL_ENABLE_TIMING" not in env(nccl_timing=False)  # exposed comm only
    assert "TORCH_NCCL_ENABLE_TIMING" not in env(nccl_timing=True, comm_timing=False)
