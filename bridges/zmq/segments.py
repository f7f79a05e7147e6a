"""Steps <-> ``segment`` messages.

A segment carries consecutive ``Step`` objects of one episode, column-wise:

* per-step scalars (tick, reward, flags, ...) as msgpack lists in ``columns``;
* ``state``, ``action``, ``policy_action``, ``rolled_state`` stacked into float32
  ``[N, dim]`` arrays (the optional ones with a ``has_*`` mask column, because a
  Step may have None there);
* each camera image as its own encoded buffer ``image/<camera>/<i>`` (JPEG, PNG
  or raw), described once per camera in ``images`` with its HxWx3 shape.

Everything round-trips exactly except JPEG pixels. Encoding happens on the edge's
background thread, never on the control thread (it costs milliseconds per image).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

import cv2
import numpy as np

from robot_rl.bridges.zmq.protocol import ProtocolError, Segment
from robot_rl.core import Step
from robot_rl.core.types import SUCCESS_SOURCES

IMAGE_FORMATS = ("jpeg", "png", "raw")
MAX_IMAGE_PIXELS = 4096 * 4096  # refuse to decode anything bigger (decompression bombs)
_IMREAD_RGB = getattr(cv2, "IMREAD_COLOR_RGB", None)  # OpenCV >= 4.10

# Step attribute -> Python type on the wire. Order is irrelevant; the set is exact.
SCALAR_COLUMNS: dict[str, type] = {
    "tick": int,
    "time_s": float,
    "instruction": str,
    "is_intervention": bool,
    "reward": float,
    "done": bool,
    "success": bool,
    "policy_version": int,
    "chunk_id": int,
    "chunk_index": int,
    "delay_ticks": int,
    "stall": bool,
    "lateness_s": float,
    "scene_seed": int,
}
# Columns a sender may leave out: a segment from an edge that predates them decodes with the Step's
# defaults (its ``success`` meant the task's verdict then). The protocol version stays: old edges and
# the segments they spooled before an upgrade are still stored.
OPTIONAL_COLUMNS: dict[str, type] = {
    "success_source": str,  # "" (nobody judged), "operator", "task", "detector"
    "success_confidence": float,  # in [0, 1]
}
# Each integer column's admitted range. A tick or version past 2**31 - 1 is two years of ticks at
# 30 Hz (or as many weight versions): only a broken or hostile sender writes one, and the dataset's
# int columns must hold every stored value. -1 is "none" where a step may have none.
INT_RANGES: dict[str, tuple[int, int]] = {
    "tick": (0, 2**31 - 1),
    "policy_version": (-1, 2**31 - 1),
    "chunk_id": (-1, 2**31 - 1),
    "chunk_index": (-1, 2**31 - 1),
    "delay_ticks": (0, 2**31 - 1),
    "scene_seed": (-1, 2**63 - 1),
}
REQUIRED_ARRAYS = ("state", "action")
OPTIONAL_ARRAYS = ("policy_action", "rolled_state")  # each with a "has_<name>" mask column
_MASKS = {name: f"has_{name}" for name in OPTIONAL_ARRAYS}


@dataclass(frozen=True)
class ImageEncoding:
    """How camera frames are compressed on the wire.

    ``jpeg`` (default) is ~10x smaller and lossy; ``png`` is lossless; ``raw`` sends
    the pixels as they are (loopback / benchmarks, where CPU matters more than bytes).
    """

    format: str = "jpeg"
    jpeg_quality: int = 90
    png_compression: int = 1  # 0..9; 1 is fast and already lossless

    def __post_init__(self) -> None:
        if self.format not in IMAGE_FORMATS:
            raise ValueError(f"image format {self.format!r} unknown; use one of {IMAGE_FORMATS}")
        if not 0 <= self.jpeg_quality <= 100:
            raise ValueError(f"jpeg_quality must be in 0..100, got {self.jpeg_quality}")


# ---------------------------------------------------------------- images


def encode_image(rgb: np.ndarray, enc: ImageEncoding) -> np.ndarray:
    """uint8 HxWx3 RGB -> 1-D uint8 buffer in ``enc.format``."""
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"images must be uint8 HxWx3 RGB, got {rgb.dtype} {rgb.shape}")
    if enc.format == "raw":
        return np.ascontiguousarray(rgb).reshape(-1)
    bgr = cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2BGR)
    if enc.format == "jpeg":
        ok, buf = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, enc.jpeg_quality])
    else:
        ok, buf = cv2.imencode(".png", bgr, [cv2.IMWRITE_PNG_COMPRESSION, enc.png_compression])
    if not ok:
        raise ValueError(f"OpenCV failed to encode a {rgb.shape} image as {enc.format}")
    return buf.reshape(-1)


def _png_size(buf: bytes) -> tuple[int, int] | None:
    if len(buf) < 24 or buf[:8] != b"\x89PNG\r\n\x1a\n" or buf[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", buf[16:24])
    return height, width


def _jpeg_size(buf: bytes) -> tuple[int, int] | None:
    """(height, width) from the first SOF marker, without decoding pixels."""
    if buf[:2] != b"\xff\xd8":
        return None
    i = 2
    while i + 4 <= len(buf):
        if buf[i] != 0xFF:
            return None
        marker = buf[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # standalone markers, no length
            i += 2
            continue
        (length,) = struct.unpack(">H", buf[i + 2 : i + 4])
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if i + 9 > len(buf):
                return None
            height, width = struct.unpack(">HH", buf[i + 5 : i + 9])
            return height, width
        i += 2 + length
    return None


def decode_image(buf: np.ndarray, fmt: str, shape: tuple[int, int, int]) -> np.ndarray:
    """Encoded buffer -> uint8 HxWx3 RGB of exactly ``shape``, or ProtocolError."""
    if fmt == "raw":
        if buf.size != shape[0] * shape[1] * 3:
            raise ProtocolError(f"raw image has {buf.size} bytes, shape {list(shape)} needs {shape[0] * shape[1] * 3}")
        return buf.reshape(shape)
    head = bytes(buf[:65536])
    size = _jpeg_size(head) if fmt == "jpeg" else _png_size(head)
    if size != shape[:2]:
        raise ProtocolError(f"{fmt} image header says size {size}, the segment declares {list(shape[:2])}")
    try:
        if _IMREAD_RGB is not None:  # libjpeg/libpng write RGB directly: no BGR image + conversion pass
            rgb = cv2.imdecode(buf, _IMREAD_RGB)
        else:
            bgr = cv2.imdecode(buf, cv2.IMREAD_COLOR)
            rgb = None if bgr is None else cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    except cv2.error as exc:
        raise ProtocolError(f"{fmt} image cannot be decoded: {exc}") from exc
    if rgb is None or rgb.shape != shape:
        got = None if rgb is None else rgb.shape
        raise ProtocolError(f"{fmt} image does not decode to {list(shape)} (got {got})")
    return rgb


# ---------------------------------------------------------------- encode


def _stack(steps: Sequence[Step], name: str) -> tuple[np.ndarray | None, list[bool]]:
    """Stack one array attribute of all steps; None entries become zero rows + mask False."""
    values = [getattr(s, name) for s in steps]
    present = [v is not None for v in values]
    if not any(present):
        return None, present
    template = np.asarray(next(v for v in values if v is not None), dtype=np.float32)
    rows = []
    for i, v in enumerate(values):
        row = np.zeros_like(template) if v is None else np.asarray(v, dtype=np.float32)
        if row.shape != template.shape:
            raise ValueError(f"step {i}: {name} has shape {row.shape}, earlier steps have {template.shape}")
        rows.append(row)
    return np.stack(rows), present


def encode_segment(
    robot_id: str,
    episode_id: int,
    seq: int,
    steps: Sequence[Step],
    *,
    episode_done: bool = False,
    image_encoding: ImageEncoding = ImageEncoding(),
) -> Segment:
    """Pack ``steps`` (one episode, consecutive) into a ``segment`` message."""
    columns: dict[str, list[Any]] = {
        name: [kind(getattr(s, name)) for s in steps] for name, kind in {**SCALAR_COLUMNS, **OPTIONAL_COLUMNS}.items()
    }
    arrays: dict[str, np.ndarray] = {}
    for name in REQUIRED_ARRAYS + OPTIONAL_ARRAYS:
        stacked, present = _stack(steps, name)
        if name in _MASKS:
            columns[_MASKS[name]] = present
        elif not all(present):
            raise ValueError(f"every step needs a {name} array")
        if stacked is not None:
            arrays[name] = stacked
    cameras = sorted(steps[0].images) if steps else []
    images: dict[str, Any] = {}
    for cam in cameras:
        shape = tuple(steps[0].images[cam].shape)
        images[cam] = {"format": image_encoding.format, "shape": list(shape)}
        for i, s in enumerate(steps):
            if sorted(s.images) != cameras or s.images[cam].shape != shape:
                raise ValueError(f"step {i}: cameras/shapes differ from step 0 ({cameras}, {cam} {shape})")
            arrays[f"image/{cam}/{i}"] = encode_image(s.images[cam], image_encoding)
    return Segment(
        robot_id=robot_id,
        episode_id=int(episode_id),
        seq=int(seq),
        episode_done=bool(episode_done),
        num_steps=len(steps),
        columns=columns,
        images=images,
        arrays=arrays,
    )


# ---------------------------------------------------------------- decode


def _check_columns(msg: Segment) -> None:
    expected = set(SCALAR_COLUMNS) | set(_MASKS.values())
    allowed_names = expected | set(OPTIONAL_COLUMNS)
    if not expected <= set(msg.columns) <= allowed_names:
        raise ProtocolError(
            f"segment columns wrong: missing {sorted(expected - set(msg.columns))}, "
            f"unexpected {sorted(set(msg.columns) - allowed_names)}"
        )
    kinds = {**SCALAR_COLUMNS, **{mask: bool for mask in _MASKS.values()},
             **{name: kind for name, kind in OPTIONAL_COLUMNS.items() if name in msg.columns}}
    for name, kind in kinds.items():
        col = msg.columns[name]
        if not isinstance(col, list) or len(col) != msg.num_steps:
            raise ProtocolError(f"segment column {name!r} must be a list of {msg.num_steps} values")
        allowed = (int, float) if kind is float else (kind,)
        if not all(type(v) in allowed for v in col):
            raise ProtocolError(f"segment column {name!r} must hold {kind.__name__} values")


def _check_values(msg: Segment, arrays: dict[str, np.ndarray | None]) -> None:
    """Every float finite (one NaN reward poisons a value estimate for good; a NaN lateness, the
    timing report) and every integer in its range, before anything is staged or acknowledged."""
    for name, kind in SCALAR_COLUMNS.items():
        col = msg.columns[name]
        if kind is float:
            bad = next((i for i, v in enumerate(col) if not math.isfinite(v)), None)
            if bad is not None:
                raise ProtocolError(f"segment column {name!r}: step {bad} is {col[bad]!r}; every value must be finite")
        elif name in INT_RANGES:
            low, high = INT_RANGES[name]
            bad = next((i for i, v in enumerate(col) if not low <= v <= high), None)
            if bad is not None:
                raise ProtocolError(f"segment column {name!r}: step {bad} is {col[bad]}, outside [{low}, {high}]")
    sources = msg.columns.get("success_source", [])
    bad = next((i for i, v in enumerate(sources) if v not in SUCCESS_SOURCES), None)
    if bad is not None:
        raise ProtocolError(f"segment column 'success_source': step {bad} is {sources[bad]!r}; "
                            f"known {list(SUCCESS_SOURCES)}")
    confidences = msg.columns.get("success_confidence", [])
    bad = next((i for i, v in enumerate(confidences) if not 0.0 <= v <= 1.0), None)  # NaN fails too
    if bad is not None:
        raise ProtocolError(f"segment column 'success_confidence': step {bad} is {confidences[bad]!r}, "
                            "outside [0, 1]")
    for name, arr in arrays.items():
        if arr is None:
            continue
        rows = np.isfinite(arr.reshape(arr.shape[0], -1)).all(axis=1)
        if name in _MASKS:
            rows |= ~np.asarray(msg.columns[_MASKS[name]], dtype=bool)  # absent rows are placeholders
        if not rows.all():
            raise ProtocolError(f"segment array {name!r}: step {int(np.argmin(rows))} holds NaN/inf")


@overload
def _check_array(msg: Segment, name: str, required: Literal[True]) -> np.ndarray: ...


@overload
def _check_array(msg: Segment, name: str, required: bool) -> np.ndarray | None: ...


def _check_array(msg: Segment, name: str, required: bool) -> np.ndarray | None:
    arr = msg.arrays.get(name)
    if arr is None:
        if required:
            raise ProtocolError(f"segment is missing array {name!r}")
        return None
    if arr.dtype != np.float32 or arr.ndim < 1 or arr.shape[0] != msg.num_steps:
        raise ProtocolError(f"segment array {name!r} must be float32 [{msg.num_steps}, ...], "
                            f"got {arr.dtype} {arr.shape}")
    return arr


def _decode_images(msg: Segment) -> list[dict[str, np.ndarray]]:
    per_step: list[dict[str, np.ndarray]] = [{} for _ in range(msg.num_steps)]
    expected_keys: set[str] = set()
    for cam, info in msg.images.items():
        if not isinstance(info, dict) or set(info) != {"format", "shape"}:
            raise ProtocolError(f"segment images[{cam!r}] must be a map with 'format' and 'shape'")
        fmt, shape = info["format"], info["shape"]
        if fmt not in IMAGE_FORMATS:
            raise ProtocolError(f"camera {cam!r}: image format {fmt!r} unknown; known {IMAGE_FORMATS}")
        if not (isinstance(shape, list) and len(shape) == 3 and shape[2] == 3
                and all(type(d) is int and d > 0 for d in shape)):
            raise ProtocolError(f"camera {cam!r}: shape {shape!r} must be [H, W, 3]")
        if shape[0] * shape[1] > MAX_IMAGE_PIXELS:
            raise ProtocolError(f"camera {cam!r}: {shape[0]}x{shape[1]} exceeds {MAX_IMAGE_PIXELS} pixels",
                                code="too_large")
        for i in range(msg.num_steps):
            key = f"image/{cam}/{i}"
            expected_keys.add(key)
            buf = msg.arrays.get(key)
            if buf is None or buf.dtype != np.uint8 or buf.ndim != 1:
                raise ProtocolError(f"segment is missing 1-D uint8 array {key!r}")
            per_step[i][cam] = decode_image(buf, fmt, tuple(shape))
    stray = {k for k in msg.arrays if k.startswith("image/")} - expected_keys
    if stray:
        raise ProtocolError(f"segment has image arrays for no declared camera: {sorted(stray)[:5]}")
    return per_step


def check_segment(msg: Segment) -> dict[str, np.ndarray | None]:
    """Every check of ``decode_segment`` but the images' decoding (columns, array shapes, finite
    values, integer ranges); ``ProtocolError`` if one fails. The edge runs it before it spools a
    segment, so what the learner would refuse never enters the spool. Returns the step arrays."""
    _check_columns(msg)
    known = set(REQUIRED_ARRAYS + OPTIONAL_ARRAYS)
    unknown = [k for k in msg.arrays if k not in known and not k.startswith("image/")]
    if unknown:
        raise ProtocolError(f"segment has unknown arrays {unknown[:5]}")
    arrays = {"state": _check_array(msg, "state", required=True),
              "action": _check_array(msg, "action", required=True),
              **{name: _check_array(msg, name, required=False) for name in OPTIONAL_ARRAYS}}
    for name in OPTIONAL_ARRAYS:
        if arrays[name] is None and any(msg.columns[_MASKS[name]]):
            raise ProtocolError(f"segment says some steps have {name} but sends no {name!r} array")
    _check_values(msg, arrays)
    return arrays


def decode_segment(msg: Segment) -> list[Step]:
    """``segment`` message -> Steps, validating everything; ProtocolError if inconsistent.

    Array attributes are read-only views into the received frames; copy to mutate.
    """
    arrays = check_segment(msg)
    state, action = arrays["state"], arrays["action"]
    assert state is not None and action is not None  # required: check_segment raised otherwise
    optional = {name: arrays[name] for name in OPTIONAL_ARRAYS}
    images = _decode_images(msg)
    steps = []
    for i in range(msg.num_steps):
        scalars = {name: kind(msg.columns[name][i]) for name, kind in SCALAR_COLUMNS.items()}
        scalars.update({name: kind(msg.columns[name][i]) for name, kind in OPTIONAL_COLUMNS.items()
                        if name in msg.columns})
        extras: dict[str, Any] = {  # Step's optional arrays, None where a step has none
            name: (arr[i] if arr is not None and msg.columns[_MASKS[name]][i] else None)
            for name, arr in optional.items()
        }
        steps.append(Step(state=state[i], action=action[i], images=images[i], **scalars, **extras))
    return steps
