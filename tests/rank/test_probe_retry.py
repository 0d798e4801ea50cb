"""A rank that cannot reach the hub at first keeps trying for the whole run and reports
everything it measured meanwhile (issue 33.5, the rank side)."""

import socket
import threading

from waiting import hold, poll

from ddptop.rank import client
from ddptop.rank.client import Probe
from ddptop.wire import protocol


def serve_once(path: str, got: list, done: threading.Event) -> socket.socket:
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)

    def run():
        conn, _ = srv.accept()
        buf = b""
        while not done.is_set():
            chunk = conn.recv(65536)
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                got.append(protocol.decode(line))
        conn.close()

    threading.Thread(target=run, daemon=True).start()
    return srv


def test_a_probe_that_cannot_connect_yet_keeps_trying_and_loses_nothing(tmp_path, monkeypatch, capsys):
    path = str(tmp_path / "hub.sock")
    monkeypatch.setenv(protocol.ENV_ADDR, f"unix:{path}")
    monkeypatch.setenv(protocol.ENV_TOKEN, "tok")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(client, "RETRY_S", (0.05,))
    probe = Probe.open(owned=True)  # nothing listens yet
    assert probe.enabled and probe._sock is None
    for step in range(5):
        probe.record_step(step, {"step_ms": 10.0})
    probe.info({"model": "Net"}, ["a note"])
    hold(0.3, "nothing listens yet: the probe keeps trying, and loses nothing meanwhile")
    got, done = [], threading.Event()
    srv = serve_once(path, got, done)
    assert poll(lambda: probe.connected, 5, every=0.02)
    probe.record_step(5, {"step_ms": 10.0})
    probe.close("completed")
    poll(lambda: any(isinstance(m, protocol.Bye) for m in got), 5, every=0.02)
    done.set()
    srv.close()
    assert isinstance(got[0], protocol.Hello) and got[0].rank == 1 and got[0].token == "tok"
    steps = [r["step"] for m in got if isinstance(m, protocol.Steps) for r in m.records]
    assert steps == [0, 1, 2, 3, 4, 5]
    infos = [m for m in got if isinstance(m, protocol.Info)]
    assert infos and infos[0].facts == {"model": "Net"} and infos[0].notes == ["a note"]
    assert isinstance(got[-1], protocol.Bye) and got[-1].reason == "completed"
    assert "cannot reach" not in capsys.readouterr().err  # nothing added to the script's output


def test_a_probe_closed_before_it_ever_connected_stops_trying(tmp_path, monkeypatch):
    monkeypatch.setenv(protocol.ENV_ADDR, f"unix:{tmp_path / 'none.sock'}")
    monkeypatch.setattr(client, "RETRY_S", (0.02,))
    probe = Probe.open(owned=True)
    probe.record_step(0, {"step_ms": 1.0})
    probe.close("completed")
    assert not probe.enabled
    threads = [t for t in threading.enumerate() if t.name == "ddptop-connect"]
    for t in threads:
        t.join(timeout=1)
    assert not any(t.is_alive() for t in threads)
