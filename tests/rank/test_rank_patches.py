"""The rank's patch of destroy_process_group: ddptop's last steps go out before the script's
groups go, and once no group is left the instrument lets go of the script's DDPs, so they
and their groups are freed when the script lets go of them, as without ddptop."""

import socket
from types import SimpleNamespace

import pytest

from ddptop.rank import patches


class Dist:
    def __init__(self):
        self.groups = {"world", "sub"}
        self.calls = []

    def destroy_process_group(self, group=None):
        self.calls.append(("destroy", group))
        self.groups -= {group} if group is not None else set(self.groups)

    def is_initialized(self):
        return bool(self.groups)


def test_the_last_steps_go_first_and_the_ddps_are_let_go_of_once_no_group_is_left():
    dist = Dist()
    patches.wrap_destroy(dist, lambda: dist.calls.append("flush"), lambda: False, lambda: dist.calls.append("let go"))
    dist.destroy_process_group("sub")  # a subgroup: the world's DDPs still run
    assert dist.calls == ["flush", ("destroy", "sub")]
    dist.destroy_process_group()
    assert dist.calls[2:] == ["flush", ("destroy", None), "let go"]


def test_the_instrument_lets_go_of_its_ddps_and_keeps_their_timing_for_the_goodbye():
    torch = pytest.importorskip("torch")
    from ddptop.probe import Probe
    from ddptop.rank.instrument import Instrument

    ours, _hub = socket.socketpair()
    inst = Instrument(torch, Probe(ours, 0, owned=True), 0, {})
    logging = {"avg_forward_compute_time": 2_000_000, "iteration": 7}
    ddp = SimpleNamespace(_get_ddp_logging_data=lambda: logging)
    inst.ddps, inst.replicas = [ddp], {1: ddp}
    inst._let_go()
    assert inst.ddps == [] and inst.replicas == {} and inst.hooked.modules == []
    assert inst._ddp_timing == {"forward_compute_ms": 2.0, "iteration": 7.0}
    inst._let_go()  # again at exit: the timing stays
    assert inst._ddp_timing == {"forward_compute_ms": 2.0, "iteration": 7.0}
    ours.close()
    _hub.close()
