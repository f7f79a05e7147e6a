"""The message catalogue of the robot_rl wire protocol, with strict validation.

Each message is a frozen dataclass whose ``TYPE`` is its wire name. Its fields
are the message body; fields annotated ``np.ndarray`` (or ``ArrayMap``) travel as
raw frames (see ``codec.py``). Every field is required on the wire, extra fields
are refused, and each value is type-checked, so a peer running different code
gets a clear ``ProtocolError`` instead of a half-understood message.

Who sends what (E = edge client, L = learner server)::

    E->L  hello            first message on a connection; L answers hello_ok or error
    L->E  hello_ok
    E->L  segment          steps of one episode, keyed (robot_id, episode_id, seq)
    L->E  ack              the segment is stored (or was already: duplicate=True), with the success
                           detector's latest guess on the episode so far when the learner has one
    L->E  refused          the segment is malformed and never will be stored: the edge sets it aside
    both  heartbeat        liveness + policy version in use + small stats
    E->L  stats            free-form numeric stats report
    L->E  weights_announce on PUB (and after hello): a new weights snapshot exists
    E->L  weights_fetch    ask for one chunk of a snapshot
    L->E  weights_chunk    one chunk, with its own sha256
    both  error            code + human-readable message; the connection stays up

``encode_message`` / ``decode_message`` are the only entry points most code needs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from robot_rl.bridges.zmq.codec import (
    DEFAULT_LIMITS,
    PROTOCOL_VERSION,
    FrameLike,
    Limits,
    ProtocolError,
    decode_frames,
    encode_frames,
)
from robot_rl.core.types import DetectorGuess

Scalar = int | float | str | bool
StatsMap = dict[str, Scalar]  # flat map of numbers/strings, e.g. counters
Document = dict[str, Any]  # any msgpack map with string keys; validated by its consumer
ArrayMap = dict[str, np.ndarray]  # named arrays, each sent as its own frame

# Error codes a peer may send. Free text goes in Error.message.
ERROR_CODES = frozenset(
    {
        "bad_message",  # malformed frames / envelope / fields
        "bad_dtype",  # array dtype not on the allow-list
        "too_large",  # over the receiver's size limits
        "version_mismatch",  # protocol version differs
        "config_mismatch",  # config hash differs between edge and learner
        "identity_mismatch",  # the robot_id is not the one its CURVE key was issued to
        "hello_required",  # a request arrived before a successful hello
        "unknown_type",  # no such message type
        "unexpected",  # valid message, wrong direction or state
        "weights_unavailable",  # the requested weights version/chunk is not served
        "rejected",  # the handler refused the request (see message)
        "busy",  # well-formed, but the learner cannot take it now (a bound, a full disk): send it again later
        "internal",  # a bug on the replying side; the message says what
    }
)
# A segment refused with one of these is malformed as sent (a NaN reward, a wrong dtype or size): no
# learner will ever store those bytes, so it is answered ``refused`` and the edge sets it aside instead
# of re-sending it. ``rejected`` (this learner's layout) and ``busy`` are not: another learner, or this
# one later, takes it.
PERMANENT_REFUSALS = frozenset({"bad_message", "bad_dtype", "too_large"})
# Robot ids name files, log lines and console rows: a robot's name, not a payload.
MAX_ROBOT_ID_CHARS = 64


@dataclass(frozen=True, kw_only=True)
class Message:
    """Base of all messages. Subclasses set ``TYPE`` and declare fields."""

    TYPE: ClassVar[str] = ""


@dataclass(frozen=True, kw_only=True)
class Hello(Message):
    """Edge introduces itself. The protocol version travels in every envelope."""

    TYPE: ClassVar[str] = "hello"
    robot_id: str
    config_hash: str  # hash of the policy/robot config; must match the learner's
    policy_version: int  # weights version in use (-1: none yet)
    # What the robot records per step: {"fps", "joint_names", "cameras": {name: [H, W]}}
    # (robot_rl.learner.layout); {} says nothing, and is accepted only by a store that already knows.
    features: Document = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class HelloOk(Message):
    TYPE: ClassVar[str] = "hello_ok"
    server_id: str
    config_hash: str
    latest_version: int  # newest weights version the learner serves (-1: none)
    heartbeat_interval_s: float
    max_message_bytes: int


@dataclass(frozen=True, kw_only=True)
class Error(Message):
    TYPE: ClassVar[str] = "error"
    code: str
    message: str
    in_reply_to: str = ""  # type of the offending message, "" if unknown


@dataclass(frozen=True, kw_only=True)
class Segment(Message):
    """Consecutive steps of one episode. Built and read by ``segments.py``."""

    TYPE: ClassVar[str] = "segment"
    robot_id: str
    episode_id: int
    seq: int  # 0, 1, 2... within the episode; (robot_id, episode_id, seq) is the dedup key
    episode_done: bool  # last segment of the episode
    num_steps: int
    columns: Document  # per-step scalars, one list of num_steps values per column
    images: Document  # camera -> {"format", "shape"}; pixels are in ``arrays``
    arrays: ArrayMap = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Ack(Message):
    TYPE: ClassVar[str] = "ack"
    robot_id: str
    episode_id: int
    seq: int
    duplicate: bool = False  # already stored before; the edge treats it like any ack
    # The learner's success detector on this episode so far ({"success", "confidence", "sure"}), judged
    # off the acking thread, so it covers the segments before this one; {}: no guess (no trained
    # detector for the episode's task). ``guess_document`` / ``guess_of``.
    verdict: Document = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Refused(Message):
    """The segment (robot_id, episode_id, seq) is malformed and will never be stored as sent (a code of
    ``PERMANENT_REFUSALS``). The edge moves it out of its spool with this reason, so it neither holds
    a sending slot nor is re-sent; the robot's other segments flow on."""

    TYPE: ClassVar[str] = "refused"
    robot_id: str
    episode_id: int
    seq: int
    code: str
    message: str


@dataclass(frozen=True, kw_only=True)
class Heartbeat(Message):
    TYPE: ClassVar[str] = "heartbeat"
    sender: str
    policy_version: int  # edge: version in use; learner: newest version served
    time_s: float  # sender's monotonic clock, for RTT estimates
    stats: StatsMap = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Stats(Message):
    TYPE: ClassVar[str] = "stats"
    sender: str
    stats: StatsMap


@dataclass(frozen=True, kw_only=True)
class WeightsAnnounce(Message):
    """A weights snapshot is available. Single-frame on purpose: SUB uses CONFLATE,
    which only works for single-part messages.

    On the PUB socket it announces the newest version to every robot. Sent to one robot on its
    request socket it says which version that robot is to run: ``pinned`` true pins it to this
    version (loaded even if older than the one in use; other announcements are ignored until a
    direct announcement with ``pinned`` false releases it to the newest again)."""

    TYPE: ClassVar[str] = "weights_announce"
    version: int
    sha256: str  # of the whole payload (safetensors bytes)
    size: int
    num_chunks: int
    chunk_size: int
    config_hash: str
    dtype: str  # transfer dtype of floating tensors: "float32", "float16", "bfloat16"
    pinned: bool = False


@dataclass(frozen=True, kw_only=True)
class WeightsFetch(Message):
    TYPE: ClassVar[str] = "weights_fetch"
    version: int
    chunk: int


@dataclass(frozen=True, kw_only=True)
class WeightsChunk(Message):
    TYPE: ClassVar[str] = "weights_chunk"
    version: int
    chunk: int
    sha256: str  # of this chunk, so a corrupted chunk is refetched alone
    data: np.ndarray  # uint8, 1-D


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.TYPE: cls
    for cls in (Hello, HelloOk, Error, Segment, Ack, Refused, Heartbeat, Stats, WeightsAnnounce, WeightsFetch,
                WeightsChunk)
}


# ---------------------------------------------------------------- field checks


def _is_int(v: Any) -> bool:
    return type(v) is int  # bool is an int subclass; refuse it here


def _is_stats(v: Any) -> bool:
    return isinstance(v, dict) and all(
        isinstance(k, str) and isinstance(x, (int, float, str, bool)) for k, x in v.items()
    )


_CHECKS: dict[Any, tuple[str, typing.Callable[[Any], bool]]] = {
    str: ("a string", lambda v: isinstance(v, str)),
    int: ("an int", _is_int),
    float: ("a number", lambda v: type(v) in (int, float)),
    bool: ("a bool", lambda v: type(v) is bool),
    StatsMap: ("a map of string -> number/string/bool", _is_stats),
    Document: ("a map with string keys", lambda v: isinstance(v, dict) and all(isinstance(k, str) for k in v)),
}


@dataclass(frozen=True)
class _Schema:
    body: dict[str, Any]  # field name -> annotation
    array_fields: tuple[str, ...]  # single np.ndarray fields
    array_maps: tuple[str, ...]  # ArrayMap fields


_SCHEMAS: dict[type[Message], _Schema] = {}


def _schema(cls: type[Message]) -> _Schema:
    """Sort a message class's fields into body fields and array fields (cached)."""
    if cls not in _SCHEMAS:
        hints = typing.get_type_hints(cls)
        body: dict[str, Any] = {}
        singles, maps = [], []
        for f in dataclasses.fields(cls):
            ann = hints[f.name]
            if ann is np.ndarray:
                singles.append(f.name)
            elif ann == ArrayMap:
                maps.append(f.name)
            elif ann in _CHECKS:
                body[f.name] = ann
            else:
                raise TypeError(f"{cls.__name__}.{f.name}: annotation {ann!r} has no wire check")
        _SCHEMAS[cls] = _Schema(body, tuple(singles), tuple(maps))
    return _SCHEMAS[cls]


for _cls in MESSAGE_TYPES.values():  # fail at import time, not on the first message
    _schema(_cls)


# ---------------------------------------------------------------- entry points


def encode_message(msg: Message) -> list[Any]:
    """Frames for ``socket.send_multipart(frames, copy=False)``."""
    schema = _schema(type(msg))
    body = {name: getattr(msg, name) for name in schema.body}
    arrays: dict[str, Any] = {name: getattr(msg, name) for name in schema.array_fields}
    for map_name in schema.array_maps:
        for key, value in getattr(msg, map_name).items():
            arrays[f"{map_name}.{key}"] = value
    return encode_frames(msg.TYPE, body, arrays)


def _build(cls: type[Message], body: dict[str, Any], arrays: dict[str, np.ndarray]) -> Message:
    schema = _schema(cls)
    missing = sorted(set(schema.body) - set(body))
    extra = sorted(map(str, set(body) - set(schema.body)))
    if missing or extra:
        raise ProtocolError(f"{cls.TYPE}: missing fields {missing}, unexpected fields {extra}")
    kwargs: dict[str, Any] = {}
    for name, ann in schema.body.items():
        what, ok = _CHECKS[ann]
        value = body[name]
        if not ok(value):
            raise ProtocolError(f"{cls.TYPE}.{name} must be {what}, got {type(value).__name__} {value!r:.80}")
        kwargs[name] = float(value) if ann is float else value
    maps: dict[str, dict[str, np.ndarray]] = {m: {} for m in schema.array_maps}
    for wire_name, arr in arrays.items():
        map_name, _, key = wire_name.partition(".")
        if wire_name in schema.array_fields:
            kwargs[wire_name] = arr
        elif key and map_name in maps:
            maps[map_name][key] = arr
        else:
            raise ProtocolError(f"{cls.TYPE}: unexpected array {wire_name!r}")
    for name in schema.array_fields:
        if name not in kwargs:
            raise ProtocolError(f"{cls.TYPE}: missing array {name!r}")
    kwargs.update(maps)
    return cls(**kwargs)


def decode_message(frames: Sequence[FrameLike], limits: Limits = DEFAULT_LIMITS) -> Message:
    """Decode and validate frames into a typed message, or raise ``ProtocolError``."""
    raw = decode_frames(frames, limits)
    cls = MESSAGE_TYPES.get(raw.type)
    if cls is None:
        raise ProtocolError(
            f"unknown message type {raw.type!r}; known: {sorted(MESSAGE_TYPES)}", code="unknown_type"
        )
    try:
        msg = _build(cls, raw.body, raw.arrays)
    except ProtocolError as exc:
        exc.in_reply_to = raw.type
        raise
    try:
        _check_semantics(msg)
    except ProtocolError as exc:
        exc.in_reply_to = raw.type
        raise
    return msg


_GUESS_KEYS = {"success": bool, "confidence": float, "sure": bool}


def guess_document(guess: DetectorGuess | None) -> Document:
    """``Ack.verdict`` for a detector's guess (None: ``{}``)."""
    if guess is None:
        return {}
    return {"success": guess.success, "confidence": float(guess.confidence), "sure": guess.sure}


def guess_of(ack: Ack) -> DetectorGuess | None:
    """The detector's guess an ack carries (None: it carries none); checked on decoding."""
    if not ack.verdict:
        return None
    return DetectorGuess(ack.episode_id, ack.verdict["success"], float(ack.verdict["confidence"]),
                         ack.verdict["sure"])


def _check_guess(verdict: Document) -> None:
    if not verdict:
        return
    kinds = {key: type(value) for key, value in verdict.items()}
    if set(kinds) != set(_GUESS_KEYS) or not all(kinds[k] is t or (t is float and kinds[k] is int)
                                                 for k, t in _GUESS_KEYS.items()):
        raise ProtocolError(f"ack.verdict must be {{}} or hold success (bool), confidence (number) and sure (bool), "
                            f"got {verdict!r:.120}")
    if not 0.0 <= verdict["confidence"] <= 1.0:
        raise ProtocolError(f"ack.verdict.confidence must be in [0, 1], got {verdict['confidence']!r}")


def _check_semantics(msg: Message) -> None:
    """Value checks that types alone cannot express."""
    if isinstance(msg, Ack):
        _check_guess(msg.verdict)
    if isinstance(msg, WeightsChunk) and (msg.data.dtype != np.uint8 or msg.data.ndim != 1):
        raise ProtocolError(f"weights_chunk.data must be 1-D uint8, got {msg.data.dtype} {msg.data.shape}")
    if isinstance(msg, Segment) and (msg.num_steps < 0 or msg.seq < 0):
        raise ProtocolError(f"segment: num_steps ({msg.num_steps}) and seq ({msg.seq}) must be >= 0")
    if isinstance(msg, (WeightsFetch, WeightsChunk)) and msg.chunk < 0:
        raise ProtocolError(f"{msg.TYPE}.chunk must be >= 0, got {msg.chunk}")
    robot_id = getattr(msg, "robot_id", None)
    if robot_id is not None:
        check_robot_id(robot_id, msg.TYPE)


def check_robot_id(robot_id: str, where: str = "robot id") -> None:
    """A robot id is 1..``MAX_ROBOT_ID_CHARS`` characters (``ProtocolError`` otherwise)."""
    if not 0 < len(robot_id) <= MAX_ROBOT_ID_CHARS:
        raise ProtocolError(f"{where}: robot id of {len(robot_id)} characters; a robot id has 1 to "
                            f"{MAX_ROBOT_ID_CHARS}")


def error_for(exc: ProtocolError, in_reply_to: str = "") -> Error:
    """The ``error`` reply for a refused message."""
    code = exc.code if exc.code in ERROR_CODES else "bad_message"
    return Error(code=code, message=str(exc), in_reply_to=exc.in_reply_to or in_reply_to)


def segment_refusal(exc: ProtocolError, msg: Segment) -> Error | Refused:
    """The reply to a segment the learner refuses: ``refused`` (set aside by the edge) when it is
    malformed as sent, else the ``error`` (the edge keeps it and sends it again)."""
    if exc.code not in PERMANENT_REFUSALS:
        return error_for(exc, msg.TYPE)
    return Refused(robot_id=msg.robot_id, episode_id=msg.episode_id, seq=msg.seq, code=exc.code, message=str(exc))


def config_hash(config: Any) -> str:
    """Short stable hash of a config (a dict / dataclass-as-dict of JSON-able values).

    Edge and learner compute it from the parts of their config that must agree
    (policy architecture, action space, cameras); hello and weights carry it.
    """
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


__all__ = [
    "config_hash",
    "guess_document",
    "guess_of",
    "PROTOCOL_VERSION",
    "ERROR_CODES",
    "MAX_ROBOT_ID_CHARS",
    "MESSAGE_TYPES",
    "PERMANENT_REFUSALS",
    "Ack",
    "Error",
    "Hello",
    "HelloOk",
    "Heartbeat",
    "Limits",
    "Message",
    "ProtocolError",
    "Refused",
    "Segment",
    "Stats",
    "WeightsAnnounce",
    "WeightsChunk",
    "WeightsFetch",
    "check_robot_id",
    "decode_message",
    "encode_message",
    "error_for",
    "segment_refusal",
]
