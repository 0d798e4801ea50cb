import json

import pytest

from ddptop.wire import protocol
from ddptop.wire.protocol import (
    Bye,
    CaptureReport,
    Command,
    Hello,
    Info,
    ProtocolError,
    Steps,
    decode,
    encode,
)


def hello(**kw):
    base = dict(rank=1, local_rank=1, world_size=2, host="h", pid=42, token="t", device="cpu")
    return Hello(**{**base, **kw})


def test_round_trip_every_kind():
    msgs = [
        hello(backend="gloo", torch="2.14", nccl="2.28.9"),
        Steps(rank=0, records=[{"step": 3, "t": 1.5, "step_ms": 12.5, "data_ms": 1.0, "samples": 32}]),
        Bye(rank=1, reason="stopped"),
        Bye(rank=0, ddp_timing={"backward_comm_ms": 3.2, "iteration": 10}),
        Command("stop", at_step=17),
        Command("capture", at_step=10, args={"count": 3}),
    ]
    for msg in msgs:
        line = encode(msg)
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert decode(line) == msg


def test_a_frame_is_the_bytes_dataclasses_asdict_made():
    """encode takes the fields as they are (asdict's deep copy cost the sender thread ~28 µs a
    step record): the same bytes for every kind of message, spans, facts and notes too."""
    import dataclasses

    msgs = [hello(backend="gloo"), Steps(rank=2, records=[{"step": 1, "step_ms": 3.5}], spans={4: ((0.5, 1.0),)}),
            Bye(rank=0, ddp_timing={"iteration": 10}), Info(rank=1, facts={"ddp": True, "x": 1.5}, notes=["a"]),
            Command("capture", at_step=10, args={"count": 3, "dir": "c"}),
            CaptureReport(rank=0, capture_id=1, status="written", files=["a.json"], warmup=2)]
    for msg in msgs:
        data = dataclasses.asdict(msg)
        data["v"] = protocol.VERSION
        assert encode(msg) == (json.dumps(data, separators=(",", ":")) + "\n").encode()


def test_frames_carry_the_version():
    assert json.loads(encode(Bye(rank=0)))["v"] == protocol.VERSION


@pytest.mark.parametrize(
    "line, reason",
    [
        (b"not json", "not-json"),
        (b"[1,2]", "not-object"),
        (b'{"v":99,"kind":"bye","rank":0}', "version"),
        (b'{"v":1,"kind":"launch-missiles"}', "unknown-kind"),
        (b'{"v":1,"kind":"bye","rank":-1}', "bad-field"),
        (b'{"v":1,"kind":"bye","rank":"0"}', "bad-field"),
        (b'{"v":1,"kind":"steps","rank":0,"records":{}}', "bad-field"),
        (b'{"v":1,"kind":"steps","rank":0,"records":[{"step":-1}]}', "bad-record"),
        (b'{"v":1,"kind":"steps","rank":0,"records":[{"step":1,"step_ms":"fast"}]}', "bad-record"),
        (b'{"v":1,"kind":"steps","rank":0,"records":[{"step":1,"step_ms":true}]}', "bad-record"),
        (b'{"v":1,"kind":"steps","rank":0,"records":[{"step":1,"step_ms":NaN}]}', "bad-record"),
        (b'{"v":1,"kind":"bye","rank":0,"ddp_timing":{"x":"1"}}', "bad-field"),
        (b'{"v":1,"kind":"bye","rank":0,"ddp_timing":[1]}', "bad-field"),
        (b'{"v":1,"kind":"command","name":"rm -rf"}', "unknown-command"),
        (b"\xff\xfe", "not-json"),
        (b"{" * 100000, "not-json"),
    ],
)
def test_bad_frames_raise_protocol_error_with_a_reason(line, reason):
    with pytest.raises(ProtocolError) as info:
        decode(line)
    assert info.value.reason == reason


def test_oversized_frame_is_rejected_before_parsing():
    with pytest.raises(ProtocolError) as info:
        decode(b" " * (protocol.MAX_FRAME + 1))
    assert info.value.reason == "oversized"


def test_unknown_record_fields_are_dropped():
    msg = decode(b'{"v":1,"kind":"steps","rank":0,"records":[{"step":1,"step_ms":2,"evil":"x"}]}')
    assert msg.records == [{"step": 1, "step_ms": 2}]


def test_parse_addr():
    assert protocol.parse_addr("unix:/tmp/x.sock") == ("unix", "/tmp/x.sock")
    assert protocol.parse_addr("tcp:10.0.0.1:2999") == ("tcp", ("10.0.0.1", 2999))
    with pytest.raises(ValueError):
        protocol.parse_addr("http://x")


def test_bucket_spans_travel_beside_the_record_and_are_checked():
    frame = {"v": 1, "kind": "steps", "rank": 1, "records": [
        {"step": 3, "step_ms": 90.0}, {"step": 4, "step_ms": 91.0, "comm_spans": [[40, 52.5], [45.0, 66.0]]}]}
    msg = decode(json.dumps(frame))
    assert msg.spans == {4: ((40.0, 52.5), (45.0, 66.0))}
    assert all("comm_spans" not in rec for rec in msg.records)
    for bad in ([[1.0]], [[2.0, 1.0]], [[-1.0, 1.0]], [["1", 2.0]], [[float("nan"), 1.0]], [[0, 1e8]],
                [[0.0, 1.0]] * (protocol.MAX_SPANS + 1), {"a": 1}, "0,1"):
        frame["records"][1]["comm_spans"] = bad
        with pytest.raises(ProtocolError, match="comm_spans"):
            decode(json.dumps(frame))


def test_typed_commands_are_the_same_bytes_and_read_back():
    stop = protocol.StopCommand(17)
    assert encode(stop.to_command()) == encode(Command("stop", at_step=17))
    assert protocol.StopCommand.read(decode(encode(stop.to_command()))) == stop
    assert protocol.StopCommand.read(Command("stop")) == protocol.StopCommand(0)  # no step: at once
    cap = protocol.CaptureCommand(2, at_step=10, count=3, out_dir="/r/captures/2", profiler="nsys", memory=True)
    args = {"id": 2, "count": 3, "dir": "/r/captures/2", "profiler": "nsys", "memory": True}
    assert encode(cap.to_command()) == encode(Command("capture", at_step=10, args=args))
    assert protocol.CaptureCommand.read(decode(encode(cap.to_command()))) == cap
    assert protocol.CaptureCommand.read(stop.to_command()) is None
    assert protocol.StopCommand.read(cap.to_command()) is None
