"""The inference wire: an edge asks a policy server for a chunk, the server answers with it.

Same framing and security as the learner link (``codec``: a msgpack envelope plus one raw frame per
array; CURVE with the robot's key bound to its id, ``keys``): nothing on it can execute code on
decode. The edge (a DEALER) sends:

* ``infer_hello`` {robot_id}: answered ``policy_info`` (what the policy reads and writes, and the
  version served now), so the edge sizes its frames to the policy's input before anything moves;
* ``infer`` {robot_id, request_id, tick, instruction, deadline_s, pinned_version, cameras} with the
  arrays ``state`` [state_dim] f32 and ``image/<camera>`` (JPEG bytes at the policy's input size:
  two 224x224 cameras are ~20 KB where raw frames are 300 KB).

A refused hello is answered ``chunk`` with request_id ``HELLO_ID`` and the reason in ``error``.
The server (a ROUTER) answers ``chunk`` {request_id, version, queue_s, compute_s, batch, error}
with the array ``chunk`` [H, A] f32, or no array and ``error`` set. ``deadline_s`` is a budget from
the server's receipt, not a time of day: the two machines' clocks need not agree, and a request
still unanswered when its budget is spent is dropped by the server, never answered late.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from robot_rl.bridges.zmq.codec import ProtocolError, RawMessage, encode_frames

INFER_HELLO = "infer_hello"
POLICY_INFO = "policy_info"
INFER = "infer"
CHUNK = "chunk"
HELLO_ID = -1  # the request_id of a ``chunk`` reply that refuses a hello (error set)
MAX_ID_CHARS = 128  # robot ids and camera names: a bound before anything is stored under them
MAX_INSTRUCTION_CHARS = 4096


@dataclass(frozen=True)
class PolicyInfo:
    """What the served policy reads and writes: the edge checks its robot against it and resizes frames."""

    action_dim: int
    state_dim: int
    chunk_size: int
    cameras: tuple[str, ...]
    image_size: int  # frames are sent image_size x image_size, the policy's input
    config_hash: str
    version: int  # served now


@dataclass(frozen=True)
class ChunkRequest:
    robot_id: str
    request_id: int
    tick: int
    state: np.ndarray  # [state_dim] f32
    instruction: str
    jpeg: Mapping[str, np.ndarray]  # camera -> JPEG bytes (uint8), at the policy's input size
    deadline_s: float  # budget from the server's receipt; past it the request is dropped
    pinned_version: int | None = None  # serve this version (kept resident on the server), not the newest


@dataclass(frozen=True)
class ChunkReply:
    request_id: int
    chunk: np.ndarray | None  # [H, A] f32 robot units; None with ``error``
    version: int  # the weights that computed it
    queue_s: float  # from the server's receipt to the start of its forward
    compute_s: float  # the batched forward that computed it
    batch: int  # requests in that forward
    error: str | None = None


# ---------------------------------------------------------------- encoding


def encode_hello(robot_id: str) -> list[Any]:
    return encode_frames(INFER_HELLO, {"robot_id": robot_id}, {})


def encode_info(info: PolicyInfo) -> list[Any]:
    body = {"action_dim": info.action_dim, "state_dim": info.state_dim, "chunk_size": info.chunk_size,
            "cameras": list(info.cameras), "image_size": info.image_size, "config_hash": info.config_hash,
            "version": info.version}
    return encode_frames(POLICY_INFO, body, {})


def encode_request(request: ChunkRequest) -> list[Any]:
    body = {"robot_id": request.robot_id, "request_id": request.request_id, "tick": request.tick,
            "instruction": request.instruction, "deadline_s": float(request.deadline_s),
            "pinned_version": request.pinned_version, "cameras": list(request.jpeg)}
    arrays: dict[str, Any] = {"state": np.asarray(request.state, dtype=np.float32)}
    arrays.update({f"image/{cam}": buf for cam, buf in request.jpeg.items()})
    return encode_frames(INFER, body, arrays)


def encode_reply(reply: ChunkReply) -> list[Any]:
    body = {"request_id": reply.request_id, "version": reply.version, "queue_s": reply.queue_s,
            "compute_s": reply.compute_s, "batch": reply.batch, "error": reply.error}
    arrays = {} if reply.chunk is None else {"chunk": np.asarray(reply.chunk, dtype=np.float32)}
    return encode_frames(CHUNK, body, arrays)


# ---------------------------------------------------------------- decoding (every field checked)


def _field(body: Mapping[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = body.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ProtocolError(f"{what}: field {name!r} must be {kind}, got {type(value).__name__}")
    return value


def _name(body: Mapping[str, Any], name: str, what: str) -> str:
    value = _field(body, name, str, what)
    if not 0 < len(value) <= MAX_ID_CHARS:
        raise ProtocolError(f"{what}: {name} must be 1..{MAX_ID_CHARS} characters")
    return str(value)


def decode_hello(msg: RawMessage) -> str:
    return _name(msg.body, "robot_id", INFER_HELLO)


def decode_info(msg: RawMessage) -> PolicyInfo:
    body = msg.body
    cameras = _field(body, "cameras", list, POLICY_INFO)
    return PolicyInfo(action_dim=_field(body, "action_dim", int, POLICY_INFO),
                      state_dim=_field(body, "state_dim", int, POLICY_INFO),
                      chunk_size=_field(body, "chunk_size", int, POLICY_INFO),
                      cameras=tuple(str(c) for c in cameras),
                      image_size=_field(body, "image_size", int, POLICY_INFO),
                      config_hash=_field(body, "config_hash", str, POLICY_INFO),
                      version=_field(body, "version", int, POLICY_INFO))


def decode_request(msg: RawMessage) -> ChunkRequest:
    """An ``infer`` message, each field checked (``ProtocolError`` says which is wrong)."""
    body = msg.body
    instruction = _field(body, "instruction", str, INFER)
    if len(instruction) > MAX_INSTRUCTION_CHARS:
        raise ProtocolError(f"infer: instruction longer than {MAX_INSTRUCTION_CHARS} characters")
    deadline = _field(body, "deadline_s", (int, float), INFER)
    if not 0.0 <= deadline < 3600.0:
        raise ProtocolError(f"infer: deadline_s must be in [0, 3600), got {deadline}")
    pinned = body.get("pinned_version")
    if pinned is not None and (not isinstance(pinned, int) or isinstance(pinned, bool)):
        raise ProtocolError("infer: pinned_version must be an int or nil")
    cameras = _field(body, "cameras", list, INFER)
    jpeg: dict[str, np.ndarray] = {}
    for cam in cameras:
        if not isinstance(cam, str) or not 0 < len(cam) <= MAX_ID_CHARS:
            raise ProtocolError("infer: camera names must be strings of 1..128 characters")
        buf = msg.arrays.get(f"image/{cam}")
        if buf is None or buf.dtype != np.uint8 or buf.ndim != 1:
            raise ProtocolError(f"infer: camera {cam!r} needs its JPEG bytes as a uint8 array image/{cam}")
        jpeg[cam] = buf
    state = msg.arrays.get("state")
    if state is None or state.dtype != np.float32 or state.ndim != 1 or not np.isfinite(state).all():
        raise ProtocolError("infer: state must be a finite float32 vector")
    return ChunkRequest(robot_id=_name(body, "robot_id", INFER), request_id=_field(body, "request_id", int, INFER),
                        tick=_field(body, "tick", int, INFER), state=state, instruction=instruction, jpeg=jpeg,
                        deadline_s=float(deadline), pinned_version=pinned)


def decode_reply(msg: RawMessage) -> ChunkReply:
    body = msg.body
    error = body.get("error")
    chunk = msg.arrays.get("chunk")
    if chunk is not None and (chunk.dtype != np.float32 or chunk.ndim != 2):
        raise ProtocolError("chunk: the chunk must be a float32 [H, A] array")
    if chunk is None and not isinstance(error, str):
        raise ProtocolError("chunk: a reply carries a chunk or an error")
    return ChunkReply(request_id=_field(body, "request_id", int, CHUNK), chunk=chunk,
                      version=_field(body, "version", int, CHUNK),
                      queue_s=float(_field(body, "queue_s", (int, float), CHUNK)),
                      compute_s=float(_field(body, "compute_s", (int, float), CHUNK)),
                      batch=_field(body, "batch", int, CHUNK), error=error if isinstance(error, str) else None)
