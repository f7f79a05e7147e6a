"""Framing: one message = a msgpack envelope frame + one raw frame per numpy array.

Why this shape: msgpack keeps the small, self-describing part of a message
(type, fields, array descriptions) readable by any language, while big arrays
(joint trajectories, JPEG bytes, weight chunks) travel as raw ZeroMQ frames that
the receiver wraps with ``np.frombuffer`` without copying. Nothing here can
execute code on decode: no pickle, no msgpack extension types, dtypes from an
allow-list only.

Envelope (frame 0), a msgpack map with exactly these keys::

    {"v": PROTOCOL_VERSION, "type": "segment", "body": {...},
     "arrays": [{"name": "state", "dtype": "<f4", "shape": [30, 6], "frame": 1}, ...]}

Frames 1..N are the arrays, each described once, in ``frame`` order.
This module knows nothing about message types; ``protocol.py`` does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import zmq

PROTOCOL_VERSION = 6  # 6: an ack carries the success detector's guess on the episode so far (Ack.verdict)

# Little-endian, fixed-size dtypes only ("|" = byte order irrelevant). Object,
# string, void and structured dtypes are refused: they are either unsafe or not
# portable between machines.
ALLOWED_DTYPES: frozenset[str] = frozenset(
    {"|b1", "|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f2", "<f4", "<f8"}
)

_ENVELOPE_KEYS = frozenset({"v", "type", "body", "arrays"})
_ARRAY_KEYS = frozenset({"name", "dtype", "shape", "frame"})

FrameLike = zmq.Frame | bytes | bytearray | memoryview


class ProtocolError(ValueError):
    """A message that does not follow the wire protocol.

    ``code`` is the machine-readable reason sent back in an ``error`` message;
    the text says what was wrong so the peer's operator can fix it.
    """

    def __init__(self, message: str, code: str = "bad_message", in_reply_to: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.in_reply_to = in_reply_to  # message type, once known


class BusyError(RuntimeError):
    """A well-formed message the receiver cannot take now (a per-robot bound is reached, its disk is
    full). Nothing is wrong with it: it is answered ``busy`` with this text, the sender keeps it
    and sends it again later, and it never counts against the sender as a bad message."""


@dataclass(frozen=True)
class Limits:
    """Upper bounds a receiver enforces before trusting anything in a message."""

    max_message_bytes: int = 64 * 1024 * 1024  # all frames together
    max_envelope_bytes: int = 1024 * 1024  # frame 0 alone
    max_arrays: int = 4096
    max_ndim: int = 8


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class RawMessage:
    """A decoded but not yet type-checked message: what ``protocol.py`` validates."""

    type: str
    body: dict[str, Any]
    arrays: dict[str, np.ndarray]


# ---------------------------------------------------------------- encoding


def _wire_array(name: str, value: Any) -> np.ndarray:
    """Contiguous little-endian copy-free view of ``value`` (copies only if needed)."""
    arr = np.asarray(value)
    dtype = arr.dtype
    if dtype.byteorder == ">":
        dtype = dtype.newbyteorder("<")
    arr = np.ascontiguousarray(arr, dtype=dtype)
    if arr.dtype.str not in ALLOWED_DTYPES:
        raise ProtocolError(
            f"array {name!r} has dtype {arr.dtype} ({arr.dtype.str}), which the wire does not "
            f"carry; use one of {sorted(ALLOWED_DTYPES)}",
            code="bad_dtype",
        )
    return arr


def encode_frames(type_: str, body: Mapping[str, Any], arrays: Mapping[str, Any]) -> list[Any]:
    """Envelope + array frames, ready for ``socket.send_multipart(frames, copy=False)``.

    The array frames are views of the arrays' memory: do not mutate them until sent.
    """
    descriptors: list[dict[str, Any]] = []
    frames: list[Any] = [b""]  # placeholder for the envelope
    for name, value in arrays.items():
        arr = _wire_array(name, value)
        frames.append(memoryview(arr.reshape(-1)).cast("B") if arr.size else b"")
        descriptors.append(
            {"name": name, "dtype": arr.dtype.str, "shape": list(arr.shape), "frame": len(frames) - 1}
        )
    envelope = {"v": PROTOCOL_VERSION, "type": type_, "body": dict(body), "arrays": descriptors}
    try:
        frames[0] = msgpack.packb(envelope, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ProtocolError(f"cannot pack {type_!r} body as msgpack: {exc}") from exc
    return frames


# ---------------------------------------------------------------- decoding


def _as_buffer(frame: FrameLike) -> memoryview:
    view = frame.buffer if isinstance(frame, zmq.Frame) else memoryview(frame)
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _refuse_ext(code: int, data: bytes) -> Any:
    raise ProtocolError(f"msgpack extension type {code} is not allowed in envelopes")


def _unpack_envelope(buf: memoryview) -> dict[str, Any]:
    try:
        env = msgpack.unpackb(buf, raw=False, strict_map_key=True, ext_hook=_refuse_ext, timestamp=0)
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise ProtocolError(f"envelope frame is not valid msgpack ({type(exc).__name__}: {exc})") from exc
    if not isinstance(env, dict):
        raise ProtocolError(f"envelope must be a msgpack map, got {type(env).__name__}")
    # Check the version before anything else so that a peer speaking another
    # version gets told exactly that, whatever else changed in the layout.
    version = env.get("v")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"protocol version mismatch: this side speaks {PROTOCOL_VERSION}, the message says "
            f"{version!r}; run the same robot_rl release on the edge and the learner",
            code="version_mismatch",
        )
    keys = set(env)
    if keys != _ENVELOPE_KEYS:
        missing, extra = sorted(_ENVELOPE_KEYS - keys), sorted(map(str, keys - _ENVELOPE_KEYS))
        raise ProtocolError(f"envelope keys wrong: missing {missing}, unexpected {extra}")
    if not isinstance(env["type"], str):
        raise ProtocolError(f"envelope 'type' must be a string, got {type(env['type']).__name__}")
    if not isinstance(env["body"], dict):
        raise ProtocolError(f"envelope 'body' must be a map, got {type(env['body']).__name__}")
    if not isinstance(env["arrays"], list):
        raise ProtocolError(f"envelope 'arrays' must be a list, got {type(env['arrays']).__name__}")
    return env


def _check_descriptor(desc: Any, index: int, limits: Limits) -> tuple[str, np.dtype, tuple[int, ...], int]:
    if not isinstance(desc, dict) or set(desc) != _ARRAY_KEYS:
        raise ProtocolError(f"array descriptor #{index} must be a map with keys {sorted(_ARRAY_KEYS)}")
    name, dtype, shape, frame = desc["name"], desc["dtype"], desc["shape"], desc["frame"]
    if not isinstance(name, str) or not name:
        raise ProtocolError(f"array descriptor #{index}: 'name' must be a non-empty string")
    if not isinstance(dtype, str) or dtype not in ALLOWED_DTYPES:
        raise ProtocolError(
            f"array {name!r}: dtype {dtype!r} is not allowed; allowed: {sorted(ALLOWED_DTYPES)}",
            code="bad_dtype",
        )
    if (
        not isinstance(shape, list)
        or len(shape) > limits.max_ndim
        # No dimension may be longer than a whole message could hold (a zero elsewhere would let
        # [0, 2**63] through the byte count, and numpy cannot build it).
        or not all(type(d) is int and 0 <= d <= limits.max_message_bytes for d in shape)
    ):
        raise ProtocolError(
            f"array {name!r}: shape {shape!r:.80} must be a list of at most {limits.max_ndim} ints in "
            f"0..{limits.max_message_bytes}"
        )
    if type(frame) is not int:
        raise ProtocolError(f"array {name!r}: 'frame' must be an int, got {type(frame).__name__}")
    return name, np.dtype(dtype), tuple(shape), frame


def decode_frames(frames: Sequence[FrameLike], limits: Limits = DEFAULT_LIMITS) -> RawMessage:
    """Parse frames into a ``RawMessage``; raise ``ProtocolError`` on anything malformed.

    Arrays are zero-copy, read-only views of the received frames (copy them to mutate).
    """
    if len(frames) == 0:
        raise ProtocolError("empty message: expected at least an envelope frame")
    if len(frames) - 1 > limits.max_arrays:
        raise ProtocolError(f"message has {len(frames) - 1} array frames; the limit is {limits.max_arrays}")
    bufs = [_as_buffer(f) for f in frames]
    total = sum(b.nbytes for b in bufs)
    if total > limits.max_message_bytes:
        raise ProtocolError(
            f"message is {total} bytes; the limit is {limits.max_message_bytes} "
            "(send smaller segments or raise max_message_bytes on both sides)",
            code="too_large",
        )
    if bufs[0].nbytes > limits.max_envelope_bytes:
        raise ProtocolError(
            f"envelope frame is {bufs[0].nbytes} bytes; the limit is {limits.max_envelope_bytes}",
            code="too_large",
        )
    env = _unpack_envelope(bufs[0])
    descriptors = env["arrays"]
    if len(descriptors) != len(bufs) - 1:
        raise ProtocolError(
            f"envelope describes {len(descriptors)} arrays but the message has {len(bufs) - 1} array frames"
        )
    arrays: dict[str, np.ndarray] = {}
    for index, desc in enumerate(descriptors):
        name, dtype, shape, frame = _check_descriptor(desc, index, limits)
        if frame != index + 1:
            raise ProtocolError(f"array {name!r}: frame index {frame}, expected {index + 1} (arrays go in order)")
        if name in arrays:
            raise ProtocolError(f"array {name!r} is described twice")
        buf = bufs[frame]
        expected = math.prod(shape) * dtype.itemsize
        if buf.nbytes != expected:
            raise ProtocolError(
                f"array {name!r}: shape {list(shape)} of {dtype.str} needs {expected} bytes, frame {frame} "
                f"has {buf.nbytes}"
            )
        arr = np.frombuffer(buf, dtype=dtype).reshape(shape) if expected else np.zeros(shape, dtype)
        arr.flags.writeable = False  # a view of the receive buffer: never write through it
        arrays[name] = arr
    return RawMessage(type=env["type"], body=env["body"], arrays=arrays)
