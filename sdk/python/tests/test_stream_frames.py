"""The binary exec stream (application/vnd.pandastack.stream): the SDK's
frame decoder on its own, and large output through a live server."""

from __future__ import annotations

import hashlib
import json
import struct

import pytest

from pandastack import StreamError
from pandastack._base import FRAME_ERROR, FRAME_EXIT, FRAME_STDERR, FRAME_STDOUT, ExecStreamParser, FrameDecoder


def frame(kind: int, payload: bytes) -> bytes:
    return struct.pack(">BI", kind, len(payload)) + payload


def run(data: bytes, piece: int):
    parser, dec, actions = ExecStreamParser(), FrameDecoder(), []
    for i in range(0, len(data), piece):
        actions.extend(dec.actions(parser, data[i : i + piece]))
    dec.finish()
    return actions, parser.finish()


@pytest.mark.parametrize("piece", [1, 3, 7, 1 << 20])
def test_frames_in_pieces_of_any_size(piece):
    # "é" (2 bytes) cut across two stdout frames still arrives whole.
    data = (
        frame(FRAME_STDOUT, b"caf\xc3")
        + frame(FRAME_STDOUT, b"\xa9\n")
        + frame(FRAME_STDERR, b"warn\n")
        + frame(FRAME_EXIT, json.dumps({"exit_code": 3, "timed_out": False, "duration_ms": 9}).encode())
    )
    actions, res = run(data, piece)
    assert res.stdout == "café\n" and res.stderr == "warn\n" and res.exit_code == 3 and res.duration_ms == 9
    assert "".join(d for k, d in actions if k == "on_stdout") == "café\n"
    assert ("on_stderr", "warn\n") in actions


@pytest.mark.parametrize(
    "data, message",
    [
        (frame(9, b"x"), "unknown type 9"),
        (struct.pack(">BI", FRAME_STDOUT, (1 << 20) + 1), "more than the"),
        (frame(FRAME_STDOUT, b"abc")[:-1], "cut inside a frame"),
        (frame(FRAME_EXIT, b"{"), "bad exit frame"),
        (frame(FRAME_STDOUT, b"x"), "without its exit event"),
    ],
)
def test_bad_frames_raise_stream_error(data, message):
    with pytest.raises(StreamError, match=message):
        run(data, 4)


def test_error_frame_raises_its_error():
    data = frame(FRAME_STDOUT, b"x") + frame(FRAME_ERROR, json.dumps({"error": {"code": "unavailable", "message": "sandbox stopped"}}).encode())
    with pytest.raises(Exception, match="sandbox stopped"):
        run(data, 5)


def test_stream_large_output_binary(sandbox):
    """16 MiB streamed with callbacks: every byte arrives, in order."""
    made = sandbox.exec("head -c 12582912 /dev/urandom | base64 -w 100 > blob && sha256sum blob")
    want = made.stdout.split()[0]
    h = hashlib.sha256()
    res = sandbox.exec("cat blob; exit 5", on_stdout=lambda s: h.update(s.encode()), timeout=300)
    assert res.exit_code == 5
    assert h.hexdigest() == want
    assert hashlib.sha256(res.stdout.encode()).hexdigest() == want
