"""Weights on the wire: safetensors bytes, chunked, each chunk sha256-verified, the version by a digest of them.

Why safetensors: it is pure data (a JSON header + raw tensors), so loading bytes
from the network cannot execute code, unlike pickle / ``torch.load``.

The learner wraps the bytes in a ``WeightsBlob`` (version, chunking, one sha256 per chunk and the
version digest: sha256 over the size, the chunk size and the chunks' sha256s in order) and
announces it; the edge fetches chunks into a ``ChunkAssembler``, which refuses any chunk whose
sha256 differs from the one sent with it and checks the version digest of the chunks it verified
against the announced one before handing the payload out. Every byte is hashed once on each side
(a whole-payload hash on top would be a second pass: 0.7 s per GB on one core), and the learner
hashes its chunks on every core at once (hashlib releases the GIL).

``snapshot_buffer`` writes the safetensors layout straight into one buffer, one copy per tensor
(from the GPU included, cast to the wire's float type on the way), where ``safetensors``' own
``save`` makes two. Floating tensors can travel as float16/bfloat16 to halve the bytes.

torch is only imported (through ``safetensors.torch``) when torch tensors are given.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import math
import mmap
import os
import struct
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import safetensors.numpy

from robot_rl.bridges.zmq.protocol import WeightsAnnounce, WeightsChunk

TRANSFER_DTYPES = ("float32", "float16", "bfloat16")
DEFAULT_CHUNK_SIZE = 1 << 20
_META_DTYPE = "robot_rl.transfer_dtype"


SPARE_NICE = 10  # the spare snapshot buffer is faulted in behind training and serving
FAULT_IN_BYTES = 16 << 20  # per fill of zeros in ``fault_in``: the interpreter lock is free during each

BufferAllocator = Callable[[int], memoryview]  # size -> a writable byte buffer of that size
# A version's safetensors header grows by a few bytes as its version number gets longer (v9 -> v10:
# 8 bytes, the JSON padded to 8), so buffers for payloads are made this much larger: later versions
# still fit in memory whose pages are in already.
GROWTH_ROOM = 4096
# A buffer serves a payload that fits in it with at most this to spare: a whole safetensors header
# (~100 bytes a tensor; a thousand tensors, ~0.1 MB) over the tensors, so a buffer prepared from the
# tensors' size alone serves the first version, and another model's payload never fits.
HEADER_ROOM = 1 << 20


def fault_in(buffer: memoryview | mmap.mmap) -> None:
    """Touch every page of a fresh ``buffer`` (zeros), so a later write into it only copies. In slices,
    with the interpreter lock released during each (numpy's fill; ``mmap(MAP_POPULATE)`` holds it
    throughout: a 508 ms stall measured for 1 GB). Call it from a thread of low priority."""
    pages = np.frombuffer(buffer, dtype=np.uint8)
    for start in range(0, pages.size, FAULT_IN_BYTES):
        pages[start:start + FAULT_IN_BYTES] = 0
    del pages


def fits(capacity: int, size: int) -> bool:
    """Whether a buffer of ``capacity`` bytes serves a payload of ``size`` bytes (``HEADER_ROOM``)."""
    return size <= capacity <= size + HEADER_ROOM


class WeightsError(ValueError):
    """Weights bytes that fail verification or cannot be (de)serialized."""


def sha256_hex(data: bytes | memoryview | np.ndarray) -> str:
    return hashlib.sha256(memoryview(data).cast("B") if not isinstance(data, bytes) else data).hexdigest()


def version_digest(chunk_digests: list[bytes], size: int, chunk_size: int) -> str:
    """The digest a version is announced by: sha256 over its size, chunk size and the chunks' raw
    sha256 digests in order. Equal digests mean equal payloads as surely as one sha256 of the
    whole would, and it costs nothing once each chunk is hashed."""
    digest = hashlib.sha256(f"robot_rl.weights:{size}:{chunk_size}:".encode())
    for chunk in chunk_digests:
        digest.update(chunk)
    return digest.hexdigest()


def fresh_buffer(size: int) -> memoryview:
    """A writable byte buffer of ``size`` for a payload, asked for in huge pages where the kernel
    offers them (Linux transparent huge pages, ``madvise`` mode): the first write to fresh memory
    faults in every page, and in 4 KB pages that costs ~0.1 s per 100 MB."""
    if size == 0:
        return memoryview(bytearray())
    buffer = mmap.mmap(-1, size)  # anonymous and private; unmapped when the last view goes
    if hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):
            buffer.madvise(mmap.MADV_HUGEPAGE)
    return memoryview(buffer)


def _chunk_digests(data: bytes | memoryview, chunk_size: int) -> list[bytes]:
    """sha256 of every chunk, on every core (hashlib releases the GIL for large buffers)."""
    view = memoryview(data).cast("B")
    spans = [view[start:start + chunk_size] for start in range(0, max(1, view.nbytes), chunk_size)]
    if len(spans) < 4:
        return [hashlib.sha256(span).digest() for span in spans]
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        return list(pool.map(lambda span: hashlib.sha256(span).digest(), spans))


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


_SAFETENSORS_CODES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
                      "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


def snapshot_buffer(tensors: Mapping[str, Any], *, transfer_dtype: str = "float32",
                    metadata: Mapping[str, str] | None = None, allocate: BufferAllocator = fresh_buffer) -> memoryview:
    """torch ``tensors`` -> safetensors bytes in one buffer from ``allocate``, one copy per tensor.

    The same layout ``safetensors.torch.save`` writes (8-byte header length, JSON header padded
    to 8 bytes, tensors back to back in name order), read by any safetensors reader. Each tensor
    is copied once into its place, by ``torch.cat`` with the CPU tensors of one dtype beside it
    (``_copy_runs``) or ``Tensor.copy_`` (the GIL released, a GPU tensor read directly,
    floats cast to ``transfer_dtype`` in the same pass). What ``serialize_tensors`` gives as
    ``bytes``, as a ``memoryview`` of the buffer.
    """
    import torch

    if transfer_dtype not in TRANSFER_DTYPES:
        raise WeightsError(f"transfer_dtype {transfer_dtype!r} unknown; use one of {TRANSFER_DTYPES}")
    target = getattr(torch, transfer_dtype)
    header: dict[str, Any] = {"__metadata__": {**(metadata or {}), _META_DTYPE: transfer_dtype}}
    layout = []
    offset = 0
    for name in sorted(tensors):
        t = torch.as_tensor(tensors[name]).detach()
        dtype = target if t.is_floating_point() else t.dtype
        code = _SAFETENSORS_CODES.get(str(dtype).removeprefix("torch."))
        if code is None:
            raise WeightsError(f"tensor {name!r}: dtype {dtype} has no safetensors code here")
        nbytes = t.numel() * torch.empty((), dtype=dtype).element_size()
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + nbytes]}
        layout.append((t, dtype, offset))
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    base = 8 + len(text)
    buffer = memoryview(allocate(base + offset)).cast("B")
    buffer[:8] = struct.pack("<Q", len(text))
    buffer[8:base] = text
    with torch.no_grad():
        for run in _copy_runs(layout):
            t, dtype, start = run[0]
            count = sum(t.numel() for t, _, _ in run)
            place = torch.frombuffer(buffer, dtype=dtype, count=count, offset=base + start)
            if len(run) == 1:
                place.copy_(t.reshape(-1))
            else:
                torch.cat([t.reshape(-1) for t, _, _ in run], out=place)
    return buffer


def _copy_runs(layout: list[tuple[Any, Any, int]]) -> list[list[tuple[Any, Any, int]]]:
    """``layout``'s non-empty tensors (tensor, wire dtype, offset), in runs written by one call each:
    consecutive CPU tensors of one wire dtype (``torch.cat`` into their place, the cast included), or
    one tensor alone (one on a GPU is copied straight from it). Each call is a parallel region of
    torch's worker threads and waits for the slowest of them: beside two busy processes on 2 cores,
    140 small tensors (10 MB) took 4.8 ms median and up to 324 ms one ``copy_`` each, and 0.5 ms
    median, up to 13 ms, as one ``cat`` (measured outside the bench)."""
    return _runs([entry for entry in layout if entry[0].numel()],
                 lambda a, b: a[0].device.type == b[0].device.type == "cpu" and a[1] == b[1])


def _runs(items: list[Any], joins: Callable[[Any, Any], bool]) -> list[list[Any]]:
    """``items`` in order, cut into runs: an item joins the run before it when ``joins(last, item)``."""
    runs: list[list[Any]] = []
    for item in items:
        if runs and joins(runs[-1][-1], item):
            runs[-1].append(item)
        else:
            runs.append([item])
    return runs


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


_FLOAT_CODES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def non_finite_tensor_in(data: bytearray | memoryview) -> str | None:
    """The name of the first floating-point tensor of safetensors ``data`` holding NaN/inf, or None.

    Reads the bytes a robot would load, after the cast to the wire's dtype (a float32 weight above
    65504 is an inf in float16). Tensors of one float dtype that lie back to back, as a snapshot
    writes them, are read as one run: one ``aminmax`` over contiguous memory, not one per tensor. A
    LoRA adapter has hundreds of small tensors; one torch call each (every one a parallel region
    that waits for its slowest worker thread) took 2.6-64 ms, median 10, per 10 MB publish in the
    transport bench's learner, and one call per run 0.9-5 ms (header parse included).
    Only a run found non-finite is searched for the tensor to name. ``data`` must be writable
    (``torch.frombuffer`` wants it; nothing is written).
    """
    import torch

    floats = sorted(((name, v) for name, v in tensor_views(data).items() if v.nbytes and v.dtype in _FLOAT_CODES),
                    key=lambda item: item[1].offset)
    runs = _runs(floats, lambda a, b: a[1].dtype == b[1].dtype and a[1].offset + a[1].nbytes == b[1].offset)

    def finite(start: int, nbytes: int, code: str) -> bool:
        dtype = getattr(torch, _FLOAT_CODES[code])
        values = torch.frombuffer(data, dtype=dtype, count=nbytes // SAFETENSORS_DTYPE_SIZES[code], offset=start)
        return all(bool(torch.isfinite(extreme)) for extreme in torch.aminmax(values))

    for run in runs:
        first, last = run[0][1], run[-1][1]
        if not finite(first.offset, last.offset + last.nbytes - first.offset, first.dtype):
            return next(name for name, view in run if not finite(view.offset, view.nbytes, view.dtype))
    return None


# ---------------------------------------------------------------- learner side


class SnapshotBuffers:
    """The learner's snapshot buffers: each taken back when the server stops serving its version,
    and one spare prepared in the background while none is free.

    Why: a fresh buffer's pages are faulted in by the snapshot's copy, 0.5 to 2.5 s per GB where
    transparent huge pages are off (more while the kernel reclaims memory), against 0.1 s for the
    copy into pages already touched. A model's versions all have one size, so the buffer of the version
    the server just dropped is the next snapshot's; until the server drops one (it keeps
    ``keep_weight_versions``), a thread of low priority faults in a spare between two publishes,
    with the interpreter lock released. A chunk of a dropped version still queued in ZeroMQ when the
    buffer is written again would reach its robot corrupt and be refused by its sha256 (the version
    is no longer served either way). Thread-safe: the trainer allocates, the server's thread
    recycles, the spare's thread adds.
    """

    def __init__(self, keep_free: int = 1) -> None:
        self.keep_free = keep_free  # one model, one size: one spare buffer is all a publish needs
        self._free: list[memoryview] = []
        self._lock = threading.Lock()
        self._preparing = False
        self._recycling = False
        self.reused = 0  # snapshots written into a buffer touched before (recycled or prepared)
        self.fresh = 0  # snapshots that had to fault in fresh pages on the publishing thread

    @property
    def spare(self) -> int:
        """Buffers waiting for the next snapshot."""
        return len(self._free)

    def allocate(self, size: int) -> memoryview:
        with self._lock:
            match = next((i for i, buffer in enumerate(self._free) if fits(buffer.nbytes, size)), None)
            buffer = self._free.pop(match) if match is not None else None
            self.reused += buffer is not None
            self.fresh += buffer is None
        self._prepare_spare(size)
        return (buffer if buffer is not None else fresh_buffer(size + GROWTH_ROOM))[:size]

    def recycle(self, buffer: memoryview) -> None:
        """``buffer``: what ``allocate`` gave (or a view of it); the whole buffer behind it is kept."""
        given = memoryview(buffer)
        view = memoryview(given.obj).cast("B") if given.obj is not None else given.cast("B")
        if view.readonly or view.nbytes == 0:
            return
        with self._lock:
            self._recycling = True  # the server drops versions now: no spare needs preparing any more
        self._keep(view)

    def _keep(self, view: memoryview) -> None:
        with self._lock:
            self._free.append(view)
            while len(self._free) > self.keep_free:
                self._free.pop(0)  # the oldest spare goes: a size no longer published

    def _prepare_spare(self, size: int) -> None:
        with self._lock:
            if (self.keep_free == 0 or size == 0 or self._preparing or self._recycling
                    or any(fits(buffer.nbytes, size) for buffer in self._free)):
                return
            self._preparing = True
        threading.Thread(target=self._fault_in_spare, args=(size,), name="snapshot-spare", daemon=True).start()

    def _fault_in_spare(self, size: int) -> None:
        from robot_rl.core.priority import lower_own_priority

        lower_own_priority(SPARE_NICE)
        try:
            buffer = fresh_buffer(size + GROWTH_ROOM)
            fault_in(buffer)
            self._keep(buffer)
        finally:
            with self._lock:
                self._preparing = False


@dataclass(frozen=True)
class WeightsBlob:
    """One published weights snapshot, served chunk by chunk (one serialization, however many robots fetch it)."""

    version: int
    data: bytes | memoryview
    config_hash: str
    dtype: str = "float32"
    chunk_size: int = DEFAULT_CHUNK_SIZE
    on_retire: Callable[[memoryview], None] | None = field(default=None, repr=False, compare=False)
    sha256: str = field(init=False)  # the version digest (``version_digest``)
    _chunk_hashes: list[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.chunk_size <= 0:
            raise ValueError(f"chunk_size must be > 0, got {self.chunk_size}")
        digests = _chunk_digests(self.data, self.chunk_size)
        object.__setattr__(self, "_chunk_hashes", [d.hex() for d in digests])
        object.__setattr__(self, "sha256", version_digest(digests, len(self), self.chunk_size))

    def __len__(self) -> int:
        return memoryview(self.data).nbytes

    @property
    def num_chunks(self) -> int:
        return max(1, -(-len(self) // self.chunk_size))

    def chunk(self, index: int) -> memoryview:
        if not 0 <= index < self.num_chunks:
            raise IndexError(f"chunk {index} out of range 0..{self.num_chunks - 1}")
        return memoryview(self.data).cast("B")[index * self.chunk_size : (index + 1) * self.chunk_size]

    def chunk_message(self, index: int) -> WeightsChunk:
        data = np.frombuffer(self.chunk(index), dtype=np.uint8)
        return WeightsChunk(version=self.version, chunk=index, sha256=self._chunk_hashes[index], data=data)

    def retire(self) -> None:
        """No robot can fetch this version any more (the server dropped it): its buffer may be reused."""
        if self.on_retire is not None and not isinstance(self.data, bytes):
            self.on_retire(memoryview(self.data))

    def announce(self, *, pinned: bool = False) -> WeightsAnnounce:
        return WeightsAnnounce(
            version=self.version,
            sha256=self.sha256,
            size=len(self),
            num_chunks=self.num_chunks,
            chunk_size=self.chunk_size,
            config_hash=self.config_hash,
            dtype=self.dtype,
            pinned=pinned,
        )


# ---------------------------------------------------------------- edge side


class ChunkAssembler:
    """Collects the chunks of one announced snapshot and verifies them.

    Chunks are taken in two steps so that verifying them overlaps the transfer: ``receive`` only
    checks that a chunk belongs (it is then no longer ``missing``, so it is not requested again),
    and ``store_received`` hashes every chunk received since on ``workers`` threads at once and
    copies the good ones into place, both with the interpreter lock released. The link asks for
    the next chunks between the two, so the learner sends while the edge hashes (sha256 runs at
    ~1.7 GB/s per core here: on one thread alone it was most of a 1 GB download).
    """

    def __init__(self, announce: WeightsAnnounce, max_size: int = 16 << 30,
                 allocate: BufferAllocator | None = None) -> None:
        expected_chunks = max(1, -(-announce.size // announce.chunk_size)) if announce.chunk_size > 0 else -1
        if not 0 <= announce.size <= max_size or expected_chunks != announce.num_chunks:
            raise WeightsError(
                f"weights v{announce.version}: inconsistent announce (size {announce.size}, "
                f"chunk_size {announce.chunk_size}, num_chunks {announce.num_chunks}, max size {max_size})"
            )
        self.announce = announce
        # Never bytearray(size): it zero-fills the whole payload up front while holding the GIL
        # (~0.1 s for 100 MB, a stall for every other thread of the edge process); a fresh mapping
        # is filled lazily, each chunk's copy touching only its own pages.
        # ``allocate`` places the payload where its consumer reads it (an edge whose policy runs in
        # another process: a shared file), so the download is never copied between processes.
        buffer = allocate(announce.size) if allocate is not None else fresh_buffer(announce.size)
        self._buffer = memoryview(buffer).cast("B")
        if self._buffer.nbytes != announce.size or self._buffer.readonly:
            raise WeightsError(f"weights v{announce.version}: the allocator gave {self._buffer.nbytes} "
                               f"{'read-only ' if self._buffer.readonly else ''}bytes for {announce.size}")
        self._missing = set(range(announce.num_chunks))
        self._received: dict[int, WeightsChunk] = {}  # chunk -> message, not verified yet
        self._digests: list[bytes] = [b""] * announce.num_chunks  # each chunk's, as verified here

    def receive(self, msg: WeightsChunk) -> None:
        """Hold one chunk for ``store_received``; raise ``WeightsError`` if it does not belong here."""
        a = self.announce
        if msg.version != a.version or not 0 <= msg.chunk < a.num_chunks:
            raise WeightsError(f"chunk {msg.chunk} of v{msg.version} does not belong to v{a.version} "
                               f"({a.num_chunks} chunks)")
        expected_len = min(a.chunk_size, a.size - msg.chunk * a.chunk_size)
        if msg.data.size != expected_len:
            raise WeightsError(f"weights v{a.version} chunk {msg.chunk}: {msg.data.size} bytes, "
                               f"expected {expected_len}")
        if msg.chunk in self._missing:
            self._received[msg.chunk] = msg

    @property
    def received(self) -> int:
        """Chunks waiting for ``store_received``."""
        return len(self._received)

    def store_received(self, workers: Executor | None = None) -> list[WeightsError]:
        """Verify every chunk received since the last call and store the good ones; the corrupt ones
        (returned) are missing again. ``workers``: threads to hash on (None: this thread)."""
        chunks, self._received = list(self._received.values()), {}
        if workers is None or len(chunks) < 2:
            outcomes = [self._verify_and_store(chunk) for chunk in chunks]
        else:
            outcomes = list(workers.map(self._verify_and_store, chunks))
        errors = []
        for chunk, outcome in zip(chunks, outcomes, strict=True):
            if isinstance(outcome, WeightsError):
                errors.append(outcome)
            else:
                self._digests[chunk.chunk] = outcome
                self._missing.discard(chunk.chunk)
        return errors

    def _verify_and_store(self, msg: WeightsChunk) -> bytes | WeightsError:
        """The chunk's sha256 if it matches the one sent with it (then it is copied into place);
        else the error. Runs on a worker thread: hashlib and numpy's copy release the interpreter lock."""
        digest = hashlib.sha256(memoryview(msg.data).cast("B")).digest()
        if digest.hex() != msg.sha256:
            return WeightsError(f"weights v{self.announce.version} chunk {msg.chunk}: sha256 mismatch "
                                "(corrupted in transit); refetch it")
        start = msg.chunk * self.announce.chunk_size
        place = np.frombuffer(self._buffer[start : start + msg.data.size], dtype=np.uint8)
        np.copyto(place, msg.data)  # one memcpy, without the interpreter lock (a memoryview copy holds it)
        return digest

    def missing(self) -> list[int]:
        """Chunks neither stored nor waiting to be verified: the ones to request."""
        return sorted(self._missing - self._received.keys())

    @property
    def complete(self) -> bool:
        return not self._missing  # every chunk verified and stored

    def result(self) -> memoryview:
        """The verified payload. Raises ``WeightsError`` if incomplete or the version digest differs.

        A byte ``memoryview`` of the assembly buffer itself, not a copy (a 100 MB ``bytes`` copy
        would hold the GIL for tens of milliseconds on the edge); it is writable, so tensors can
        be views of it (``tensor_views`` + ``torch.frombuffer``); ``bytes(result)`` copies it.
        The assembler must not be used afterwards.
        """
        if self._missing:
            raise WeightsError(f"weights v{self.announce.version}: {len(self._missing)} chunks still missing")
        digest = version_digest(self._digests, self.announce.size, self.announce.chunk_size)
        if digest != self.announce.sha256:
            raise WeightsError(
                f"weights v{self.announce.version}: digest {digest[:16]}... differs from announced "
                f"{self.announce.sha256[:16]}...; refusing these bytes"
            )
        return self._buffer
