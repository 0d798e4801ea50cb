"""The viewer protocol: snapshots are JSON of an explicit schema (ddptop.viewer_wire.state_codec) that
round-trips everything the views read, deltas rebuild the same state, and a pickle, a
wrong version or garbage is refused with one line in both directions: by the functions,
by a real Supervisor on its socket, and by a RemoteSession facing a fake supervisor."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import os
import pickle
import random
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_gpu import SNAPSHOT, fake_pynvml

from ddptop.analysis.advisor import advise_run
from ddptop.analysis.capture import Capture
from ddptop.analysis.nccl import NcclParser
from ddptop.hw import gpu
from ddptop.model.config import RunConfig, preset_config
from ddptop.model.state import RECENT, Histogram, RunState, Stall
from ddptop.remote.live import LiveRun
from ddptop.remote.viewer import RemoteSession, ViewerError
from ddptop.viewer_wire import state_codec
from ddptop.viewer_wire import viewer_protocol as vp
from ddptop.wire.protocol import Bye, Hello, Info, Steps

FIXTURES = Path(__file__).parents[1] / "fixtures"
EVIL = b"cddptop.__main__\nNope\n."  # protocol-0 pickle: a viewer that unpickled it ran the CLI


def realistic_state(n_ranks: int = 4, steps: int = 300) -> RunState:
    """A run as a supervisor holds it: built by applying what ranks send, plus every part the
    session hangs on it (GPU samples and topology from the NVML fixture, the NCCL report from
    the fixture logs, advice, a capture, a stall, logs, notes)."""
    now = 1_800_000_000.0
    rng = random.Random(1)
    config = preset_config("overlap", RunConfig(nproc=n_ranks, steps=1000, warmup=3))
    state = RunState(run_id="20270115-093000-overlap-abcd", config=config, world_size=n_ranks,
                     warmup=3, started_at=now - 100, nnodes=1)
    for r in range(n_ranks):
        state.apply(Hello(rank=r, local_rank=r, world_size=n_ranks, host="h200", pid=4000 + r, token="s3cret",
                          device=f"cuda:{r}", torch="2.11", nccl="2.28.9"), now)
        state.apply(Info(rank=r, facts={"backend": "nccl", "model": "GPT", "params": 124_000_000,
                                        "batch_size": 16, "bucket_cap_mb": 25.0, "static_graph": False},
                         notes=["comm hook: none"]), now)
        for step in range(steps):
            rec: dict[str, float] = {"step": step, "t": now - (steps - step) * 0.1, "step_ms": 90 + rng.random(),
                                     "data_ms": 1.5, "forward_ms": 30.25, "backward_ms": 50 + rng.random(),
                                     "optimizer_ms": 4, "samples": 16, "loss": 2.5 - step / 1000}
            if step % 3 == 0:
                rec.update(comm_ms=20 + rng.random(), exposed_comm_ms=3.5, comm_bytes=497_000_000, buckets=5)
            if step in (40, 41):
                rec["profiled"] = 1
            state.apply(Steps(rank=r, records=[rec]), now)
        state.add_log(r, f"[rank {r}] step 0 ok ünïcødé \ud800 lone surrogate")
    state.apply(Bye(rank=n_ranks - 1, reason="crashed", ddp_timing={"avg_forward_compute_time": 31.5}), now)
    state.rank_disconnected(n_ranks - 2, now)
    for line in (FIXTURES / "nccl" / "h200x4_nvlink_info.log").read_text().splitlines()[:400]:
        state.add_log(-1, line)
    state.status = "running"
    for i in range(50):
        state.history.append((i * 1.0, 10 + i / 100))
    nvml = gpu.Nvml(module=fake_pynvml(SNAPSHOT))
    for k in range(3):
        sample = nvml.sample()
        state.gpu = dataclasses.replace(sample, t=now - 3 + k)
        state.gpu_history.append(state.gpu)
    state.topology = nvml.topology()
    state.nccl = NcclParser().feed_lines(
        (FIXTURES / "nccl" / "h200x4_nvlink_info.log").read_text().splitlines()).report()
    state.advice = advise_run(state.summary(), state.nccl, state.topology)
    state.proc_stats = {4000: (97.5, 3 << 30), 4001: (88.0, 3 << 30)}
    state.captures[1] = Capture(1, 40, 2, "torch", "/runs/x/captures/1", status="done",
                                ranks={0: "written", 1: "failed"}, files={0: ["/runs/x/captures/1/r0.json.gz"]},
                                error="", summary={"ranks": {"0": {"comm_ms": 21.5, "top": [{"name": "k", "ms": 1}]}},
                                                   "comm_ms_mean": 21.5})
    state.captures[2] = Capture(2, 90, 3, "nsys", "/runs/x/captures/2")
    state.stall = Stall(since=now - 20, bound_s=10.0, last_steps={0: 299, 1: 299}, suspects=[1],
                        process_status={0: "running", 1: "stopped"}, stacks={1: "/runs/x/stacks/1.txt"},
                        cause="nsys writing")
    state.stalls = 2
    state.drop("viewer-not-json")
    state.refused = 1
    state.nsys = {"files": ["a.nsys-rep (10 bytes)"], "stats": {}}
    state.command = ["python", "train.py", "--lr", "3e-4"]
    state.notes.append("no NVML on node 1")
    state.gpu_unavailable = ""
    return state


def same(a: Any, b: Any, path: str = "state") -> None:
    """Deep equality that also holds types (a tuple stays a tuple, 3 stays an int) and ring
    sizes: what a view reads back is exactly what the supervisor had."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, Histogram):
        assert (a.n, dict(a.counts)) == (b.n, dict(b.counts)), path
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, dict):
        assert list(a) == list(b) or set(a) == set(b), f"{path}: keys {set(a) ^ set(b)}"
        for k in a:
            same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, list | tuple | collections.deque):
        if isinstance(a, collections.deque):
            assert a.maxlen == b.maxlen, f"{path}: maxlen"
        assert len(a) == len(b), f"{path}: {len(a)} != {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def tokenless(state: RunState) -> RunState:
    for rs in state.ranks.values():
        if rs.hello is not None:
            rs.hello = dataclasses.replace(rs.hello, token="")
    return state


# --- the schema ----------------------------------------------------------------------------


def test_a_realistic_state_round_trips_whole_with_no_hub_token() -> None:
    state = realistic_state()
    payload = vp.dump_state(state)
    assert b"s3cret" not in payload  # a rank's hub token is no viewer's business
    back = vp.load_state(payload)
    same(tokenless(realistic_state()), back)
    assert back.summary() == state.summary()
    # what the views derive, spot-checked on the derived figures too
    assert back.straggler() == state.straggler() and back.step_ms_pcts(50, 95) == state.step_ms_pcts(50, 95)
    assert back.nccl.primary.ring_pairs() == state.nccl.primary.ring_pairs()
    assert back.topology.link(0, 1) == state.topology.link(0, 1) and back.gpu.gpu_of_pid() == state.gpu.gpu_of_pid()
    cap = vp.load_capture(vp.dump_capture(state.captures[1]))
    same(state.captures[1], cap)


def test_a_payload_is_plain_json_that_names_no_class() -> None:
    text = vp.dump_state(realistic_state()).decode()
    json.loads(text)
    assert not {"RunState", "ddptop.model.state", "GpuSample", "__main__"} & set(text.replace('"', " ").split())
    assert len(state_codec.SCHEMA) == 12


def advance(state: RunState, tick: int) -> None:
    """Half a second of a run: two ranks step, one logs a line, a throughput point, a GPU sample."""
    now = time.time()
    for r in range(2):
        state.apply(Steps(rank=r, records=[{"step": 300 + tick, "t": now, "step_ms": 91.0, "samples": 16}]), now)
    state.add_log(0, f"tick {tick}")
    state.history.append((100.0 + tick, 11.0))
    state.gpu = dataclasses.replace(state.gpu, t=state.gpu.t + 1)
    state.gpu_history.append(state.gpu)


def test_deltas_rebuild_the_state_a_full_snapshot_would() -> None:
    state = tokenless(realistic_state())
    viewer = vp.load_state(vp.dump_state(state))
    marks = state_codec.marks(state)
    for tick in range(4):
        advance(state, tick)
        delta = vp.dump_state(state, marks)
        assert len(delta) < len(vp.dump_state(state)) / 4
        viewer = vp.load_state(delta, viewer)
        marks = state_codec.marks(state)
        same(state, viewer)
    assert list(viewer.logs[0])[-1] == "tick 3" and len(viewer.ranks[0].recent) == RECENT
    for _ in range(RECENT + 5):  # more steps than a window between two snapshots: the whole window goes
        advance(state, 9)
    same(state, vp.load_state(vp.dump_state(state, marks), viewer))

    # A delta that does not follow what the viewer has is refused, not misread.
    stale = realistic_state()
    with pytest.raises(vp.ViewerProtocolError, match="do not follow"):
        vp.load_state(vp.dump_state(state, state_codec.marks(state)), vp.load_state(vp.dump_state(stale)))
    with pytest.raises(vp.ViewerProtocolError, match="nothing before it"):
        vp.load_state(vp.dump_state(state, marks))


def test_every_viewer_stays_in_step_through_the_supervisors_snapshots(
        sock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Viewers of one supervisor: one from the start, one that attaches between two ticks, one
    whose connection backs up for a tick; each ends with the supervisor's state exactly."""
    from ddptop.remote.supervisor import Supervisor

    class Connection:  # the supervisor's writer for one viewer, and what RemoteSession builds from it
        def __init__(self) -> None:
            self.state: RunState | None = None
            self.got: list[str] = []
            self.full = False
            self.transport = SimpleNamespace(is_closing=lambda: False,
                                             get_write_buffer_size=lambda: 1 << 40 if self.full else 0)

        def write(self, data: bytes) -> None:
            head, _, payload = data.partition(b"\n")
            msg = vp.decode(head)
            assert len(payload) == msg.get("size", 0)
            if msg["kind"] == "state":
                self.state = vp.load_state(payload, self.state)
                self.got.append("delta" if json.loads(payload)["delta"] else "full")

        async def drain(self) -> None:
            pass

    async def attach(conn: Connection) -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(vp.encode("hello", token=sup.token, owner=False))
        assert await sup._welcome(reader, conn) is not None  # type: ignore[arg-type]

    state = tokenless(realistic_state())
    sup = Supervisor(fake_session(state), sock_dir, detached=True)  # type: ignore[arg-type]
    monkeypatch.setattr(sup, "_write_entry", lambda: None)
    first, late, slow = Connection(), Connection(), Connection()
    asyncio.run(attach(first))
    asyncio.run(attach(slow))
    for tick in range(6):
        advance(state, tick)
        if tick == 2:
            asyncio.run(attach(late))
            advance(state, tick)
        slow.full = tick == 3
        sup._broadcast(final=False)
        for conn in (first, late, slow) if tick >= 2 else (first, slow):
            if not conn.full:
                same(state, conn.state)
    assert first.got == ["full"] + ["delta"] * 6
    assert late.got == ["full"] + ["delta"] * 4
    assert slow.got == ["full", "delta", "delta", "delta", "full", "delta"]  # missed tick 3: all again
    sup._broadcast(final=True)
    assert {c.got[-1] for c in (first, late, slow)} == {"full"}


def test_many_ranks_take_the_columnar_path_and_sparse_keys_survive() -> None:
    recs = [{"step": i, "t": 1.5 * i, **({"comm_ms": 2.0} if i % 2 else {}), "n": 7 if i else 7.5} for i in range(9)]
    back = state_codec.records_from_wire(json.loads(json.dumps(state_codec.records_to_wire(recs))), "r", 9)
    assert back == recs and [type(r["n"]) for r in back][:2] == [float, float]  # a mixed column: floats
    assert type(back[3]["step"]) is int
    assert state_codec.records_from_wire(state_codec.records_to_wire([]), "r", 9) == []


# --- refusals, as functions ----------------------------------------------------------------


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert text and "\n" not in text and len(text) < 400, text
    return text


@pytest.mark.parametrize("payload", [
    EVIL,
    pickle.dumps(realistic_state(2, 5)),
    pickle.dumps({"delta": False, "state": {}}, protocol=0),
    b"", b"\x00\xff" * 50, b"{", b"[]", b"null", b'{"delta": false}', b'{"delta": true, "state": {}}',
    b'{"delta": false, "state": {"run_id": 1}}', b"[" * 100_000 + b"]" * 100_000,
])
def test_pickles_and_garbage_are_refused_as_snapshots(payload: bytes) -> None:
    before = set(sys.modules)
    with pytest.raises(vp.ViewerProtocolError) as err:
        vp.load_state(payload)
    one_line(err.value)
    with pytest.raises(vp.ViewerProtocolError):
        vp.load_capture(payload)
    assert "ddptop.__main__" not in set(sys.modules) - before


def mutations(tree: Any, path: tuple = ()) -> list[tuple]:
    """Every path into a plain tree (capped per list, so a rank's 2000 log lines count once)."""
    out = [path]
    if isinstance(tree, dict):
        for k, v in tree.items():
            out += mutations(v, (*path, k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree[:3]):
            out += mutations(v, (*path, i))
    return out


def test_every_field_with_a_wrong_value_is_refused_by_name_never_with_a_traceback() -> None:
    good = json.loads(vp.dump_state(realistic_state(2, 20)))
    paths = mutations(good)
    assert len(paths) > 500
    wrong = ["x", -1, 2**70, 1.5, None, True, [], {}, [1, "a"], {"1": 2}, {"x": None}, float("nan")]
    refused = 0
    top = {"root": good}
    for i, path in enumerate(paths):
        node = top
        for key in ("root", *path)[:-1]:
            node = node[key]
        last = ("root", *path)[-1]
        kept = node[last]
        for value in (wrong[i % len(wrong)], wrong[(i * 5 + 3) % len(wrong)]):
            node[last] = value  # in place, put back below: decoding reads its input only
            try:
                state_codec.state_from_dict(top["root"])
            except vp.ViewerProtocolError as exc:
                one_line(exc)
                refused += 1
            # anything else escapes and fails the test
        node[last] = kept
    assert refused > len(paths)  # of 2 * len(paths): the rest were still valid (null where null is fine)
    state_codec.state_from_dict(good)  # and the original still decodes


@pytest.mark.parametrize(("change", "said"), [
    ({"nccl_env": {"LD_PRELOAD": "/tmp/evil.so"}}, "RunState.config: nccl_env: LD_PRELOAD is not allowed"),
    ({"nproc": 0}, "RunState.config: nproc must be at least 1"),
    ({"preset": "turbo"}, "RunState.config: unknown preset 'turbo'"),
    ({"bucket_cap_mb": "25"}, "RunConfig.bucket_cap_mb: expected a number"),
    ({"a_knob_from_the_future": 1}, "RunConfig fields differ from this ddptop's: a_knob_from_the_future"),
])
def test_a_snapshots_config_is_a_run_config_refused_as_a_run_refuses_it(change: dict[str, Any], said: str) -> None:
    """The config crosses the wire as JSON and becomes a RunConfig at the decoder, with the
    checks a run's config gets (issue 48): what no run could have is one line, not a state."""
    good = json.loads(vp.dump_state(realistic_state(2, 5)))
    assert state_codec.state_from_dict(good).config == realistic_state(2, 5).config
    good["state"]["config"].update(change)
    with pytest.raises(vp.ViewerProtocolError) as err:
        state_codec.state_from_dict(good)
    assert said in one_line(err.value)


def test_a_scripts_run_keeps_its_config_and_summary_through_the_wire() -> None:
    """A user's script's run holds its script_view: the viewer's summary says what the
    supervisor's does (the script's knobs only, no trainer steps or model)."""
    config = preset_config("bf16", RunConfig(nproc=2, script=True, warmup=3))
    state = realistic_state(2, 5)
    state.config, state.command = config.script_view(), ["python", "train.py"]
    back = vp.load_state(vp.dump_state(state))
    assert back.config == config.script_view() and back.config.script
    assert back.summary()["config"] == state.summary()["config"] == config.script_dict()


def test_versions_are_compared_at_the_handshake() -> None:
    hello = vp.decode(vp.encode("hello", token="t", owner=False))
    assert hello["v"] == vp.VERSION == 2 and hello["schema"] == state_codec.SCHEMA and vp.mismatch(hello) == ""
    welcome = vp.decode(vp.encode("welcome", run_id="r", owner=False, detached=True))
    assert vp.mismatch(welcome) == ""
    for other in ({"v": 1, "kind": "hello", "token": "t"}, {**hello, "v": 3}, {**hello, "schema": "0" * 12},
                  {"kind": "hello"}):
        reason = vp.mismatch(other)
        assert "viewer protocol" in reason and "\n" not in reason
    assert vp.mismatch({"v": 1, "kind": "hello"}).startswith("viewer protocol 1/- is not this ddptop's 2/")
    # `refused` carries no version: a viewer of any version reads why (protocol 1 checked `v`)
    assert json.loads(vp.encode("refused", reason="x")) == {"kind": "refused", "reason": "x"}
    for line in (EVIL, b"\xff\xfe", b"[1]", b'{"kind": 3}', b"x" * (vp.MAX_LINE + 1)):
        with pytest.raises(vp.ViewerProtocolError):
            vp.decode(line)


# --- refusals on real sockets ----------------------------------------------------------------


@pytest.fixture
def sock_dir() -> Any:
    path = Path(tempfile.mkdtemp(prefix="vp", dir="/tmp"))  # 0700; short for socket paths
    yield path
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def fake_session(state: RunState) -> SimpleNamespace:
    return SimpleNamespace(state=state, done=False, run_id=state.run_id,
                           request_stop=lambda reason="": None)


BAD_HELLOS = {
    "pickle": EVIL,
    "old viewer": b'{"v": 1, "kind": "hello", "token": "TOKEN", "owner": false}\n',
    "other schema": vp.encode("hello", token="TOKEN", owner=False).replace(state_codec.SCHEMA.encode(), b"0" * 12),
    "garbage": b"\x00\x01\x02 not json\n",
    "endless line": b"x" * (vp.MAX_LINE + 10),
}


@pytest.mark.parametrize("name", list(BAD_HELLOS))
def test_the_supervisor_refuses_a_bad_hello_with_one_line_and_logs_one(
        name: str, sock_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ddptop.remote.supervisor import Supervisor

    state = realistic_state(2, 5)
    sup = Supervisor(fake_session(state), sock_dir, detached=True)  # type: ignore[arg-type]
    hello = BAD_HELLOS[name].replace(b"TOKEN", sup.token.encode())

    async def main() -> tuple[bytes, bytes]:
        server = await asyncio.start_unix_server(sup._serve, path=str(sup.socket_path), limit=vp.MAX_LINE)
        try:
            reader, writer = await asyncio.open_unix_connection(str(sup.socket_path))
            writer.write(hello)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            reply = await asyncio.wait_for(reader.readline(), 10)
            rest = await asyncio.wait_for(reader.read(), 10)  # then closed
            writer.close()
            return reply, rest
        finally:
            server.close()

    reply, rest = asyncio.run(main())
    msg = json.loads(reply)
    assert msg["kind"] == "refused" and "v" not in msg and rest == b"", (reply, rest)
    assert "\n" not in msg["reason"] and not sup.viewers and state.refused == 2  # one before
    if name in ("old viewer", "other schema"):
        assert msg["reason"].startswith("viewer protocol ")
    logged = [line for line in state.logs[-1] if "refused a viewer" in line]
    printed = [line for line in capsys.readouterr().out.splitlines() if "refused a viewer" in line]
    assert len(logged) == len(printed) == 1 and msg["reason"] in printed[0]


def serve_once(path: Path, answer: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]):  # noqa: ANN201
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()  # the viewer's hello
        await answer(reader, writer)
        await writer.drain()
        writer.close()

    return asyncio.start_unix_server(handle, path=str(path))


def welcome_then(payload: bytes) -> Callable[..., Awaitable[None]]:
    async def answer(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(vp.encode("welcome", run_id="r", owner=False, detached=True))
        writer.write(vp.encode("state", size=len(payload), final=False) + payload)

    return answer


def lines(*data: bytes) -> Callable[..., Awaitable[None]]:
    async def answer(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for d in data:
            writer.write(d)

    return answer


BAD_SUPERVISORS = {
    "pickled snapshot": (welcome_then(EVIL), "cannot follow run"),
    "binary pickle": (welcome_then(pickle.dumps(realistic_state(2, 5))), "cannot follow run"),
    "garbage snapshot": (welcome_then(b'{"delta": false, "state": {"run_id": []}}'), "cannot follow run"),
    "bad frame size": (lines(vp.encode("welcome", run_id="r", owner=False, detached=True),
                             b'{"v": 2, "kind": "state", "size": "big"}\n'), "bad payload size"),
    "other version": (lines(b'{"v": 3, "schema": "x", "kind": "welcome", "run_id": "r"}\n'),
                      "viewer protocol 3/x"),
    "old supervisor": (lines(b'{"v": 1, "kind": "refused", "reason": "bad hello (version 2 '
                             b'(this ddptop speaks 1))"}\n'), "refused this viewer: bad hello (version 2"),
    "garbage welcome": (lines(EVIL), "did not welcome this viewer (not-json)"),
    "silence": (lines(), "refused this viewer: it closed the connection"),
}


@pytest.mark.parametrize("name", list(BAD_SUPERVISORS))
def test_a_viewer_refuses_a_bad_supervisor_with_one_line(name: str, sock_dir: Path) -> None:
    answer, expected = BAD_SUPERVISORS[name]
    path = sock_dir / "s.sock"
    state = realistic_state(2, 5)
    entry = LiveRun(run_id=state.run_id, pid=os.getpid(), socket=str(path), token="t", run_dir=str(sock_dir),
                    runs_dir=str(sock_dir), preset="overlap", world_size=2, detached=True,
                    started_at=time.time(), config=state.config.to_dict())

    async def main() -> RemoteSession:
        server = await serve_once(path, answer)
        session = RemoteSession.attach(entry, live=sock_dir)
        try:
            with pytest.raises(ViewerError) as err:
                await asyncio.wait_for(session.run(), 20)
        finally:
            server.close()
        assert expected in one_line(err.value)
        return session

    session = asyncio.run(main())
    assert session.state.status == "failed" and expected in session.state.error
    assert "\n" not in session.state.error and session.done
