"""Weights on the wire: safetensors bytes, chunked, sha256-verified.

Why safetensors: it is pure data (a JSON header + raw tensors), so loading bytes
from the network cannot execute code, unlike pickle / ``torch.load``.

The learner wraps the bytes in a ``WeightsBlob`` (version, sha256, chunking) and
announces it; the edge fetches chunks into a ``ChunkAssembler``, which refuses any
chunk whose sha256 differs from the one sent with it and checks the whole payload
against the announced sha256 and size before handing it out. Floating tensors can
travel as float16/bfloat16 to halve the bytes.

torch is only imported (through ``safetensors.torch``) when torch tensors are given.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import safetensors.numpy

from robot_rl.bridges.zmq.protocol import WeightsAnnounce, WeightsChunk

TRANSFER_DTYPES = ("float32", "float16", "bfloat16")
DEFAULT_CHUNK_SIZE = 1 << 20
_META_DTYPE = "robot_rl.transfer_dtype"


class WeightsError(ValueError):
    """Weights bytes that fail verification or cannot be (de)serialized."""


def sha256_hex(data: bytes | memoryview | np.ndarray) -> str:
    return hashlib.sha256(memoryview(data).cast("B") if not isinstance(data, bytes) else data).hexdigest()


# ---------------------------------------------------------------- tensors <-> bytes


def _is_torch(value: Any) -> bool:
    return type(value).__module__.split(".")[0] == "torch"


def serialize_tensors(
    tensors: Mapping[str, Any], *, transfer_dtype: str = "float32", metadata: Mapping[str, str] | None = None
) -> bytes:
    """A dict of torch or numpy tensors -> safetensors bytes, floats cast to ``transfer_dtype``."""
    if transfer_dtype not in TRANSFER_DTYPES:
        raise WeightsError(f"transfer_dtype {transfer_dtype!r} unknown; use one of {TRANSFER_DTYPES}")
    meta = {**(metadata or {}), _META_DTYPE: transfer_dtype}
    if any(_is_torch(v) for v in tensors.values()):
        import torch
        from safetensors.torch import save as save_torch

        target = getattr(torch, transfer_dtype)
        out = {}
        for name, t in tensors.items():
            t = torch.as_tensor(t).detach().cpu()
            out[name] = (t.to(target) if t.is_floating_point() else t).contiguous()
        return save_torch(out, metadata=meta)
    if transfer_dtype == "bfloat16":
        raise WeightsError("numpy has no bfloat16; pass torch tensors or use transfer_dtype='float16'")
    out_np = {}
    for name, a in tensors.items():
        a = np.asarray(a)
        out_np[name] = np.ascontiguousarray(a.astype(transfer_dtype) if a.dtype.kind == "f" else a)
    return safetensors.numpy.save(out_np, metadata=meta)


def deserialize_tensors(data: bytes, *, framework: str = "numpy", cast_to: str | None = None) -> dict[str, Any]:
    """safetensors bytes -> dict of tensors (``framework`` "numpy" or "pt").

    ``cast_to`` (e.g. "float32") converts floating tensors back after a reduced-precision transfer.
    """
    try:
        if framework == "pt":
            import torch
            from safetensors.torch import load as load_torch

            loaded = load_torch(bytes(data))
            if cast_to:
                loaded = {k: v.to(getattr(torch, cast_to)) if v.is_floating_point() else v for k, v in loaded.items()}
            return loaded
        if framework != "numpy":
            raise WeightsError(f"framework {framework!r} unknown; use 'numpy' or 'pt'")
        loaded_np = safetensors.numpy.load(bytes(data))
    except WeightsError:
        raise
    except Exception as exc:  # safetensors raises its own error types on bad bytes
        raise WeightsError(f"not valid safetensors bytes: {exc}") from exc
    if cast_to:
        loaded_np = {k: v.astype(cast_to) if v.dtype.kind == "f" else v for k, v in loaded_np.items()}
    return loaded_np


# safetensors dtype code -> bytes per element (the codes ``serialize_tensors`` can produce).
SAFETENSORS_DTYPE_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
                           "U8": 1, "BOOL": 1}
_MAX_HEADER_BYTES = 100 << 20


@dataclass(frozen=True)
class TensorView:
    """One tensor of a safetensors payload, not copied: ``offset`` / ``nbytes`` locate it in the buffer."""

    dtype: str  # safetensors code, a key of SAFETENSORS_DTYPE_SIZES
    shape: tuple[int, ...]
    offset: int  # from the start of the whole payload
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def tensor_views(data: bytes | bytearray | memoryview) -> dict[str, TensorView]:
    """Parse a safetensors payload's header; the tensors stay where they are (zero copy).

    Checks what ``safetensors.load`` checks before touching tensor bytes: header length and
    JSON, known dtypes, shapes, and that every tensor's byte range matches its shape and lies
    inside the payload without overlapping another. Raises ``WeightsError`` otherwise.
    Pair with ``torch.frombuffer(data, dtype, count, offset)`` / ``np.frombuffer`` to read them.
    """
    size = memoryview(data).nbytes
    if size < 8:
        raise WeightsError(f"not valid safetensors bytes: {size} bytes, the header length alone needs 8")
    (header_len,) = struct.unpack_from("<Q", data, 0)
    if header_len > min(_MAX_HEADER_BYTES, size - 8):
        raise WeightsError(f"not valid safetensors bytes: header of {header_len} bytes in a {size}-byte payload")
    try:
        header = json.loads(bytes(memoryview(data)[8 : 8 + header_len]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WeightsError(f"not valid safetensors bytes: header is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise WeightsError("not valid safetensors bytes: header is not a JSON object")
    base, body = 8 + header_len, size - 8 - header_len
    views: dict[str, TensorView] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (TypeError, KeyError, ValueError) as exc:
            raise WeightsError(f"not valid safetensors bytes: tensor {name!r} entry {info!r}") from exc
        if dtype not in SAFETENSORS_DTYPE_SIZES:
            raise WeightsError(f"tensor {name!r}: dtype {dtype!r} not supported; "
                               f"known {sorted(SAFETENSORS_DTYPE_SIZES)}")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise WeightsError(f"tensor {name!r}: shape {shape!r} is not a list of sizes")
        if not (type(begin) is int and type(end) is int and 0 <= begin <= end <= body):
            raise WeightsError(f"tensor {name!r}: data_offsets [{begin}, {end}] outside the {body}-byte data section")
        if end - begin != math.prod(shape) * SAFETENSORS_DTYPE_SIZES[dtype]:
            raise WeightsError(f"tensor {name!r}: {end - begin} bytes do not hold {dtype} {shape}")
        views[name] = TensorView(dtype, tuple(shape), base + begin, end - begin)
    spans = sorted((v.offset, v.offset + v.nbytes) for v in views.values() if v.nbytes)
    if any(b0 < a1 for (_, a1), (b0, _) in itertools.pairwise(spans)):
        raise WeightsError("not valid safetensors bytes: tensors overlap")
    return views


# ---------------------------------------------------------------- learner side


@dataclass(frozen=True)
class WeightsBlob:
    """One published weights snapshot, served chunk by chunk."""

    version: int
    data: bytes
    config_hash: str
    dtype: str = "float32"
    chunk_size: int = DEFAULT_CHUNK_SIZE
    sha256: str = field(init=False)
    _chunk_hashes: list[str | None] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.chunk_size <= 0:
            raise ValueError(f"chunk_size must be > 0, got {self.chunk_size}")
        object.__setattr__(self, "sha256", sha256_hex(self.data))
        # Chunk hashes are computed when a chunk is first served (and kept): the announcement
        # does not wait for a second pass over the whole payload, which overlaps the transfer.
        object.__setattr__(self, "_chunk_hashes", [None] * self.num_chunks)

    @property
    def num_chunks(self) -> int:
        return max(1, -(-len(self.data) // self.chunk_size))

    def chunk(self, index: int) -> memoryview:
        if not 0 <= index < self.num_chunks:
            raise IndexError(f"chunk {index} out of range 0..{self.num_chunks - 1}")
        return memoryview(self.data)[index * self.chunk_size : (index + 1) * self.chunk_size]

    def chunk_message(self, index: int) -> WeightsChunk:
        data = np.frombuffer(self.chunk(index), dtype=np.uint8)
        digest = self._chunk_hashes[index]
        if digest is None:  # a race between two threads only computes the same value twice
            digest = self._chunk_hashes[index] = sha256_hex(self.chunk(index))
        return WeightsChunk(version=self.version, chunk=index, sha256=digest, data=data)

    def announce(self) -> WeightsAnnounce:
        return WeightsAnnounce(
            version=self.version,
            sha256=self.sha256,
            size=len(self.data),
            num_chunks=self.num_chunks,
            chunk_size=self.chunk_size,
            config_hash=self.config_hash,
            dtype=self.dtype,
        )


# ---------------------------------------------------------------- edge side


class ChunkAssembler:
    """Collects the chunks of one announced snapshot and verifies them."""

    def __init__(self, announce: WeightsAnnounce, max_size: int = 16 << 30) -> None:
        expected_chunks = max(1, -(-announce.size // announce.chunk_size)) if announce.chunk_size > 0 else -1
        if not 0 <= announce.size <= max_size or expected_chunks != announce.num_chunks:
            raise WeightsError(
                f"weights v{announce.version}: inconsistent announce (size {announce.size}, "
                f"chunk_size {announce.chunk_size}, num_chunks {announce.num_chunks}, max size {max_size})"
            )
        self.announce = announce
        # np.empty, not bytearray(size): bytearray zero-fills the whole payload up front while holding
        # the GIL (~0.1 s for 100 MB, a stall for every other thread of the edge process); np.empty
        # maps pages lazily and each chunk's copy touches only its own.
        self._buffer = memoryview(np.empty(announce.size, dtype=np.uint8)).cast("B")
        self._missing = set(range(announce.num_chunks))

    def add(self, msg: WeightsChunk) -> None:
        """Store one chunk; raise ``WeightsError`` if it does not belong or is corrupt."""
        a = self.announce
        if msg.version != a.version or not 0 <= msg.chunk < a.num_chunks:
            raise WeightsError(f"chunk {msg.chunk} of v{msg.version} does not belong to v{a.version} "
                               f"({a.num_chunks} chunks)")
        start = msg.chunk * a.chunk_size
        expected_len = min(a.chunk_size, a.size - start)
        if msg.data.size != expected_len:
            raise WeightsError(f"weights v{a.version} chunk {msg.chunk}: {msg.data.size} bytes, "
                               f"expected {expected_len}")
        if sha256_hex(msg.data) != msg.sha256:
            raise WeightsError(f"weights v{a.version} chunk {msg.chunk}: sha256 mismatch (corrupted in transit); "
                               "refetch it")
        self._buffer[start : start + expected_len] = memoryview(msg.data).cast("B")  # one memcpy
        self._missing.discard(msg.chunk)

    def missing(self) -> list[int]:
        return sorted(self._missing)

    @property
    def complete(self) -> bool:
        return not self._missing

    def result(self) -> memoryview:
        """The verified payload. Raises ``WeightsError`` if incomplete or the sha256 differs.

        A byte ``memoryview`` of the assembly buffer itself, not a copy (a 100 MB ``bytes`` copy
        would hold the GIL for tens of milliseconds on the edge); it is writable, so tensors can
        be views of it (``tensor_views`` + ``torch.frombuffer``); ``bytes(result)`` copies it.
        The assembler must not be used afterwards.
        """
        if self._missing:
            raise WeightsError(f"weights v{self.announce.version}: {len(self._missing)} chunks still missing")
        data = self._buffer
        digest = sha256_hex(data)
        if digest != self.announce.sha256:
            raise WeightsError(
                f"weights v{self.announce.version}: sha256 {digest[:16]}... differs from announced "
                f"{self.announce.sha256[:16]}...; refusing these bytes"
            )
        return data
