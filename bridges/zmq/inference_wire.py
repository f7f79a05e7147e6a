"""The inference wire: an edge asks a policy server for a chunk, the server answers with it.

Same framing and security as the learner link (``codec``: a msgpack envelope plus one raw frame per
array; CURVE with the robot's key bound to its id, ``keys``): nothing on it can execute code on
decode. The edge (a DEALER) sends:

* ``infer_hello`` {robot_id}: answered ``policy_info`` (what the policy reads and writes: per camera
  the frame it reads, ``frames`` {camera: [height, width, fit]}, with the fit that brings a camera
  frame to it, a stretch or the policy's own resize with bars; how many observations it reads a
  request; the version served now), so the edge brings its frames to the policy's input as the policy
  would and keeps as many past observations as it reads before anything moves;
* ``infer`` {robot_id, request_id, tick, instruction, deadline_s, pinned_version, cameras, past} with
  the arrays ``state`` [state_dim] f32 and ``image/<camera>`` (JPEG bytes of that frame: two 224x224
  cameras are ~20 KB where raw frames are 300 KB), and for each of the ``past``
  observations of the ticks before (a policy with ``n_obs_steps > 1``; oldest first, fewer at an
  episode's start) ``past/<i>/state`` and ``past/<i>/image/<camera>`` for the same cameras. A
  request with more past observations than the served policy reads is refused: its size stays
  bounded by what the policy uses.

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


MAX_FRAME_SIDE = 4096  # pixels: a bound on what a policy_info may ask the edge to send


@dataclass(frozen=True)
class FrameSize:
    """The frame a policy reads from one camera and how a camera frame is brought to it (its ``fit``:
    ``robot_rl.policies.trainable.FRAME_FITS``, checked where the frame is fitted)."""

    height: int
    width: int
    fit: str = "stretch"


@dataclass(frozen=True)
class PolicyInfo:
    """What the served policy reads and writes: the edge checks its robot against it and resizes frames."""

    action_dim: int
    state_dim: int
    chunk_size: int
    cameras: tuple[str, ...]
    frames: Mapping[str, FrameSize]  # per camera: the frame the policy reads, sent at that size
    config_hash: str
    version: int  # served now
    observation_steps: int = 1  # observations read a request, the current one last (LeRobot's n_obs_steps)


@dataclass(frozen=True)
class PastJpeg:
    """What the robot saw at a tick before the request: JPEG bytes by camera and its measured joint state."""

    jpeg: Mapping[str, np.ndarray]  # camera -> JPEG bytes (uint8), the request's cameras at its size
    state: np.ndarray  # [state_dim] f32


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
    past: tuple[PastJpeg, ...] = ()  # the ticks before, oldest first: a policy that reads observation history


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
            "cameras": list(info.cameras), "config_hash": info.config_hash,
            "frames": {cam: [size.height, size.width, size.fit] for cam, size in info.frames.items()},
            "version": info.version, "observation_steps": info.observation_steps}
    return encode_frames(POLICY_INFO, body, {})


def encode_request(request: ChunkRequest) -> list[Any]:
    body = {"robot_id": request.robot_id, "request_id": request.request_id, "tick": request.tick,
            "instruction": request.instruction, "deadline_s": float(request.deadline_s),
            "pinned_version": request.pinned_version, "cameras": list(request.jpeg), "past": len(request.past)}
    arrays: dict[str, Any] = {"state": np.asarray(request.state, dtype=np.float32)}
    arrays.update({f"image/{cam}": buf for cam, buf in request.jpeg.items()})
    for i, past in enumerate(request.past):  # the request's cameras: the decoder reads those under past/<i>/
        arrays[f"past/{i}/state"] = np.asarray(past.state, dtype=np.float32)
        arrays.update({f"past/{i}/image/{cam}": past.jpeg[cam] for cam in request.jpeg})
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
                      frames=_frame_sizes(_field(body, "frames", dict, POLICY_INFO)),
                      config_hash=_field(body, "config_hash", str, POLICY_INFO),
                      version=_field(body, "version", int, POLICY_INFO),
                      observation_steps=_field(body, "observation_steps", int, POLICY_INFO))


def _frame_sizes(frames: Mapping[Any, Any]) -> dict[str, FrameSize]:
    sizes = {}
    for cam, size in frames.items():
        if (not isinstance(cam, str) or not isinstance(size, list) or len(size) != 3
                or not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_FRAME_SIDE for v in size[:2])
                or not isinstance(size[2], str) or len(size[2]) > 32):
            raise ProtocolError(f"{POLICY_INFO}: frames[{cam!r}] must be [height, width, fit] with sides in "
                                f"1..{MAX_FRAME_SIDE}, got {size!r}")
        sizes[cam] = FrameSize(size[0], size[1], size[2])
    return sizes


def decode_request(msg: RawMessage, max_past: int = 0) -> ChunkRequest:
    """An ``infer`` message, each field checked (``ProtocolError`` says which is wrong). ``max_past``: the
    past observations the served policy reads (``observation_steps - 1``); a request with more is refused."""
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
    for cam in cameras:
        if not isinstance(cam, str) or not 0 < len(cam) <= MAX_ID_CHARS:
            raise ProtocolError("infer: camera names must be strings of 1..128 characters")
    past_count = _field(body, "past", int, INFER)
    if not 0 <= past_count <= max_past:
        raise ProtocolError(f"infer: {past_count} past observations, but the served policy reads {max_past} "
                            f"before the current one (policy_info observation_steps={max_past + 1})",
                            code="too_many_past")
    state = _state(msg, "state")
    past = tuple(PastJpeg(_jpeg(msg, cameras, f"past/{i}/"), _state(msg, f"past/{i}/state", state.shape))
                 for i in range(past_count))
    return ChunkRequest(robot_id=_name(body, "robot_id", INFER), request_id=_field(body, "request_id", int, INFER),
                        tick=_field(body, "tick", int, INFER), state=state, instruction=instruction,
                        jpeg=_jpeg(msg, cameras, ""), deadline_s=float(deadline), pinned_version=pinned, past=past)


def _jpeg(msg: RawMessage, cameras: list[str], prefix: str) -> dict[str, np.ndarray]:
    jpeg: dict[str, np.ndarray] = {}
    for cam in cameras:
        buf = msg.arrays.get(f"{prefix}image/{cam}")
        if buf is None or buf.dtype != np.uint8 or buf.ndim != 1:
            raise ProtocolError(f"infer: camera {cam!r} needs its JPEG bytes as a uint8 array {prefix}image/{cam}")
        jpeg[cam] = buf
    return jpeg


def _state(msg: RawMessage, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    state = msg.arrays.get(name)
    if state is None or state.dtype != np.float32 or state.ndim != 1 or not np.isfinite(state).all():
        raise ProtocolError(f"infer: {name} must be a finite float32 vector")
    if shape is not None and state.shape != shape:
        raise ProtocolError(f"infer: {name} has {state.size} values, the request's state {shape[0]}")
    return state


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
