"""The probe a script uses on its own (no instrument attached: DDPTOP_BOOT=0, or a process
started without ddptop's sitecustomize) never raises into the training loop."""

import socket

import torch

from ddptop.probe import Probe
from ddptop.wire import protocol


def _received(hub: socket.socket) -> list[protocol.Message]:
    hub.settimeout(5)
    data = b""
    while not data.endswith(b"\n"):
        data += hub.recv(65536)
    return [protocol.decode(line) for line in data.splitlines() if line]


def test_tensor_values_from_the_script_reach_the_hub_as_numbers():
    ours, hub = socket.socketpair()
    probe = Probe(ours, rank=0, owned=True)
    try:
        probe.tick(samples=32, loss=torch.tensor(0.25))  # what trainer/ and users hand over
        probe.record(1, step_ms=5.0, loss=torch.tensor([1.5]), bogus=object())
        probe.flush()
        steps = [m for m in _received(hub) if isinstance(m, protocol.Steps)]
        records = [r for m in steps for r in m.records]
        assert records[0]["loss"] == 0.25 and records[0]["samples"] == 32
        assert records[1]["loss"] == 1.5 and "bogus" not in records[1]
    finally:
        probe.close()
        hub.close()
