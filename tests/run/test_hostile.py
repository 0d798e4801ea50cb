"""Hostile telemetry at a real Hub over its Unix socket (issue 9): random bytes, truncated
frames, oversized frames, wrong types, unknown kinds and commands, after a valid hello and
as the first frame. The hub never crashes, never stalls a well-behaved rank, drops and
counts exactly the bad frames (shown in the run summary), and never takes a command from a
rank."""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from recording_sink import Sink

from ddptop.model.config import RunConfig
from ddptop.run.hub import Hub
from ddptop.run.session import Session
from ddptop.wire import protocol

TOKEN = "s3cret-token"
SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
pytestmark = pytest.mark.filterwarnings(
    "ignore:Generating overly large repr"
)  # the oversized frames


def hello(rank: int, token: str = TOKEN) -> bytes:
    return protocol.encode(
        protocol.Hello(rank=rank, local_rank=rank, world_size=2, host="h", pid=1, token=token)
    )


def steps(rank: int, step: int) -> bytes:
    return protocol.encode(protocol.Steps(rank, [{"step": step, "step_ms": 5.0, "t": 1.0}]))


# ---------------------------------------------------------------------------- hostile input

_json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
_json = st.recursive(
    _json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_fields = (
    "rank",
    "local_rank",
    "world_size",
    "host",
    "pid",
    "token",
    "records",
    "reason",
    "status",
    "files",
    "capture_id",
    "name",
    "at_step",
    "args",
    "step",
    "step_ms",
)


@st.composite
def wrong_types(draw) -> bytes:
    """A frame with the right version and a real kind, but fields of any type."""
    kind = draw(st.sampled_from(["hello", "steps", "bye", "capture", "command"]))
    data = {"v": protocol.VERSION, "kind": kind}
    data.update(draw(st.dictionaries(st.sampled_from(_fields), _json, max_size=5)))
    if kind == "steps" and draw(st.booleans()):
        data["records"] = draw(
            st.lists(
                st.dictionaries(
                    st.sampled_from(("step", "t", *protocol.STEP_FIELDS)), _json, max_size=4
                ),
                max_size=3,
            )
        )
    return json.dumps(data).encode() + b"\n"


_valid = [
    steps(1, 7),
    protocol.encode(protocol.Bye(1)),
    protocol.encode(protocol.Command("stop", at_step=3)),
    protocol.encode(protocol.Command("capture", at_step=1, args={"id": 1})),
    hello(1),
    protocol.encode(protocol.CaptureReport(1, 9, "written", ["/tmp/x"])),
    steps(0, 3),
]

piece = st.one_of(
    st.binary(max_size=300),  # random bytes (maybe newlines, maybe not)
    st.builds(
        lambda f, cut: f[: max(1, int(len(f) * cut))], st.sampled_from(_valid), st.floats(0.0, 0.99)
    ),  # truncated frames
    st.sampled_from(_valid),  # whole frames: commands, another rank's steps, a second hello
    wrong_types(),
    st.builds(
        lambda k: json.dumps({"v": protocol.VERSION, "kind": k, "rank": 1}).encode() + b"\n",
        st.text(max_size=12),
    ),  # unknown kinds
    st.builds(
        lambda v: json.dumps({"v": v, "kind": "steps", "rank": 1, "records": []}).encode() + b"\n",
        _json_scalars,
    ),  # wrong versions
    st.builds(lambda n: b"[" * n + b"\n", st.integers(1, 5000)),  # deep nesting
    st.builds(
        lambda n, nl: b"x" * (protocol.MAX_FRAME + n) + (b"\n" if nl else b""),
        st.integers(1, 70_000),
        st.booleans(),
    ),  # oversized, ended or not
)
payloads = st.lists(piece, min_size=1, max_size=6).map(b"".join)


def expected_outcome(payload: bytes, rank: int) -> tuple[int, list[int]]:
    """What the hub must make of `payload` + b"\\n" from an authenticated `rank`: how many
    frames it drops, and the steps it delivers; each complete line is one frame."""
    drops, delivered = 0, []
    for line in (payload + b"\n").split(b"\n")[:-1]:
        if not line.strip():
            continue
        try:
            msg = protocol.decode(line)
        except protocol.ProtocolError:
            drops += 1
            continue
        if (
            not isinstance(msg, (protocol.Steps, protocol.Bye, protocol.CaptureReport))
            or msg.rank != rank
        ):
            drops += 1
        elif isinstance(msg, protocol.Steps):
            delivered += [r["step"] for r in msg.records]
    return drops, delivered


# ---------------------------------------------------------------------------- harness


async def until(cond, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.002)


def with_hub(scenario, sink=None) -> Sink:
    """Run `scenario(hub, sink, path)` against a fresh hub; fail on any error the event loop
    saw (an exception escaping a connection handler is a hub crash)."""
    sink = sink or Sink()

    async def main() -> None:
        errors: list[dict] = []
        closing = False

        def on_error(loop, ctx) -> None:
            # Python 3.11's stream callback calls task.exception() on handler tasks that
            # Hub.close() cancelled, which raises CancelledError: a shutdown artefact, not a crash
            if not (closing and isinstance(ctx.get("exception"), asyncio.CancelledError)):
                errors.append(ctx)

        asyncio.get_running_loop().set_exception_handler(on_error)
        with tempfile.TemporaryDirectory() as tmp:
            sock_dir = Path(tmp) / "s"
            sock_dir.mkdir(mode=0o700)
            hub = Hub(TOKEN, sink)
            path = str(sock_dir / "hub.sock")
            await hub.start_unix(path)
            try:
                await scenario(hub, sink, path)
            finally:
                closing = True
                await hub.close()
        assert not errors, errors

    asyncio.run(main())
    return sink


async def good_rank(path: str):
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(hello(0))
    await writer.drain()
    return reader, writer


async def hung_up(reader: asyncio.StreamReader) -> bool:
    """True once the hub closed the connection (a reset counts: it closed with our bytes unread)."""
    try:
        return await asyncio.wait_for(reader.read(), 5) == b""
    except ConnectionResetError:
        return True


async def send(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(data)
    try:
        await writer.drain()
    except (ConnectionError, OSError):
        pass  # the hub may hang up on garbage; that is allowed


# ---------------------------------------------------------------------------- properties


@SETTINGS
@given(payload=payloads)
def test_hostile_stream_after_hello_is_dropped_counted_and_blocks_nobody(payload):
    async def scenario(hub, sink, path):
        good_r, good_w = await good_rank(path)
        _, bad = await asyncio.open_unix_connection(path)
        await send(bad, hello(1))
        await until(lambda: hub.connected_ranks == [0, 1])
        await send(bad, payload)  # may stop mid-frame: the hub must not wait on it
        await send(good_w, steps(0, 100))
        await until(lambda: 100 in sink.steps(0))  # the well-behaved rank still gets through
        await send(bad, b"\n" + steps(1, 999_999))  # ...and the hostile one resyncs on a newline
        await until(lambda: 999_999 in sink.steps(1))
        drops, delivered = expected_outcome(payload, 1)
        assert len(sink.dropped) == drops, (sink.dropped, payload[:200])
        assert sink.steps(1) == [*delivered, 999_999]
        assert sink.steps(0) == [100] and sink.refused == []
        assert not any(isinstance(m, protocol.Command) for m in sink.messages)
        assert {m.rank for m in sink.messages if not isinstance(m, protocol.Hello)} <= {0, 1}
        good_w.close()
        bad.close()
        await until(lambda: sorted(sink.gone) == [0, 1])

    with_hub(scenario)


@SETTINGS
@given(payload=payloads, then_valid=st.booleans())
def test_hostile_first_frame_is_refused_and_blocks_nobody(payload, then_valid):
    data = payload + (hello(1) + steps(1, 5) if then_valid else b"")
    first = data.split(b"\n", 1)[0]
    try:  # a payload that starts with a real hello (right token) is a legitimate rank
        assume(
            not isinstance(protocol.decode(first), protocol.Hello)
            or protocol.decode(first).token != TOKEN
        )
    except protocol.ProtocolError:
        pass

    async def scenario(hub, sink, path):
        _, good_w = await good_rank(path)
        bad_r, bad = await asyncio.open_unix_connection(path)
        await send(bad, data)
        await send(good_w, steps(0, 1))
        await until(lambda: 1 in sink.steps(0))  # not blocked by a peer that never says hello
        if bad.can_write_eof():
            bad.write_eof()
        assert await hung_up(bad_r)  # the hub hangs up on it
        await until(lambda: len(sink.refused) == 1)
        assert hub.connected_ranks == [0]
        assert [m.rank for m in sink.messages] == [0, 0]  # nothing from the refused peer
        good_w.close()
        await until(lambda: sink.gone == [0])

    with_hub(scenario)


def test_ranks_cannot_command_and_nothing_is_echoed(tmp_path):
    """A stop or capture from a rank is dropped as unexpected: no rank hears it, the sink never
    sees it; from a peer without the token it is refused outright."""

    async def scenario(hub, sink, path):
        good_r, good_w = await good_rank(path)
        _, rank1 = await asyncio.open_unix_connection(path)
        await send(
            rank1,
            hello(1)
            + protocol.encode(protocol.Command("stop", at_step=0))
            + protocol.encode(protocol.Command("capture", at_step=0, args={"id": 1}))
            + steps(1, 2),
        )
        await until(lambda: 2 in sink.steps(1))
        assert sink.dropped == ["unexpected-command", "unexpected-command"]
        stranger_r, stranger = await asyncio.open_unix_connection(path)
        await send(stranger, protocol.encode(protocol.Command("stop", at_step=0)))
        assert await hung_up(stranger_r)
        assert sink.refused == ["first frame is not a hello"]
        _, wrong = await asyncio.open_unix_connection(path)
        await send(wrong, hello(1, token="guess") + protocol.encode(protocol.Command("stop")))
        await until(lambda: len(sink.refused) == 2)
        assert "wrong token" in sink.refused[1]
        try:  # nothing was broadcast to the ranks
            got = await asyncio.wait_for(good_r.read(1), 0.2)
        except asyncio.TimeoutError:
            got = b""
        assert got == b""
        assert not any(isinstance(m, protocol.Command) for m in sink.messages)
        good_w.close()
        rank1.close()
        wrong.close()

    with_hub(scenario)


def test_drops_and_refusals_reach_the_run_summary(tmp_path):
    """Through a real Session as the sink: the counts the TUI and summary.json show."""
    session = Session(RunConfig(nproc=2, steps=10, warmup=0), tmp_path / "runs", run_id="hostile")

    async def scenario(hub, sink, path):
        _, w = await good_rank(path)
        await send(
            w,
            b"\x00\xff garbage\n"
            + b"x" * (protocol.MAX_FRAME + 5)
            + b"\n"
            + protocol.encode(protocol.Command("stop"))
            + b'{"v":1,"kind":"nope"}\n'
            + steps(0, 4),
        )
        await until(lambda: session.state.ranks[0].last_step == 4)
        _, stranger = await asyncio.open_unix_connection(path)
        await send(stranger, b"hello?\n")
        await until(lambda: session.state.refused == 1)
        w.close()
        stranger.close()

    with_hub(scenario, sink=session.collector)  # a hub with the session's collector as its sink, as Session wires it
    summary = session.state.summary()
    assert summary["dropped_frames"] == {
        "not-json": 1,
        "oversized": 1,
        "unexpected-command": 1,
        "unknown-kind": 1,
    }
    assert summary["refused_connections"] == 1
    assert any("refused a connection" in line for line in session.state.logs[-1])


def test_many_silent_and_garbage_peers_do_not_stall_a_streaming_rank():
    async def scenario(hub, sink, path):
        peers = []
        for i in range(20):  # half never speak, half send garbage and hang mid-frame
            _, w = await asyncio.open_unix_connection(path)
            if i % 2:
                await send(w, hello(2 + i) + b'{"v":1,"kind":"steps","rank":' + str(2 + i).encode())
            peers.append(w)
        _, good_w = await good_rank(path)
        for step in range(200):
            await send(good_w, steps(0, step))
        await until(lambda: len(sink.steps(0)) == 200)
        assert sink.steps(0) == list(range(200))
        for w in [*peers, good_w]:
            w.close()

    with_hub(scenario)
