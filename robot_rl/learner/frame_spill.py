"""Frames the sampling index let go, kept on the learner's local disk at the policy's input size.

Why a spill and not only the dataset: the dataset keeps a camera's frames at the size it recorded
(640x480 video for an SO-101), so reading one back for a batch means seeking and decoding a
640x480 frame and shrinking it to the 64x64 the policy reads: about a core's worth of decoding for
two robots' training at 30 Hz, on worker processes whose memory is torch and torchcodec. A frame
the index already shrank is 12 kB of raw bytes: written here once when it leaves memory, it comes
back with one ``pread`` (from the page cache while it is warm), no decoder, no worker process, and
bit for bit the frame the index held. Two robots with two 64x64 cameras at 30 Hz spill ~5 GB an hour.

Why the dataset still backs it: the spill is a cache, not a store. It is emptied when the learner
starts (the index is read back in from the dataset, and spills again), never synced, and bounded by
``max_bytes`` of disk. Past that bound its oldest file is dropped, once every episode in it is in the
dataset; those episodes' frames are then read back from the dataset's video, as without a spill.

Layout: append-only files of ``file_bytes`` each; an entry's frames of one camera are contiguous
(``SpilledFrames``), so frame ``n`` is at a fixed offset. Readers open a file per batch by path: a file
dropped after a batch was planned is a ``FileNotFoundError`` (the batch is drawn again), never
another file's bytes under a reused descriptor.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

# One spill file's size, at most: big enough that a run keeps a few hundred files open at most; and
# at most an eighth of the spill, so that dropping the oldest file frees disk in steps, not all at once.
SPILL_FILE_BYTES = 256 << 20
SPILL_FILES_AT_LEAST = 8


@dataclass(frozen=True)
class SpilledFrames:
    """One camera's frames of one entry: ``count`` frames of ``frame_shape`` uint8 from byte ``offset`` of ``path``."""

    path: str
    offset: int
    count: int
    frame_shape: tuple[int, ...]

    @property
    def frame_bytes(self) -> int:
        return int(np.prod(self.frame_shape))


@dataclass
class _SpillFile:
    path: Path
    fd: int
    size: int = 0
    keys: list[Hashable] = field(default_factory=list)


class FrameSpill:
    """Append-only files of raw frames under ``directory`` (emptied here), at most ``max_bytes`` in all."""

    def __init__(self, directory: Path | str, max_bytes: int, file_bytes: int = SPILL_FILE_BYTES) -> None:
        if max_bytes <= 0 or file_bytes <= 0:
            raise ValueError(f"FrameSpill: max_bytes and file_bytes must be > 0, got {max_bytes}, {file_bytes}")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.file_bytes = max(1, min(file_bytes, max_bytes // SPILL_FILES_AT_LEAST))
        shutil.rmtree(self.directory, ignore_errors=True)  # a cache of the last run: the dataset holds it all
        self.directory.mkdir(parents=True)
        self._files: OrderedDict[int, _SpillFile] = OrderedDict()  # oldest first
        self._next_file = 0
        self.bytes = 0
        self.failed: str | None = None  # why writes stopped (a full disk): no more spilling this run

    def has_room(self, nbytes: int) -> bool:
        return self.failed is None and self.bytes + nbytes <= self.max_bytes

    def oldest(self) -> tuple[str, list[Hashable]] | None:
        """The oldest file (what ``drop_oldest`` would drop) and the entries written to it (some may have
        been written again since, elsewhere), or None with no file."""
        for spill_file in self._files.values():
            return str(spill_file.path), list(spill_file.keys)
        return None

    def drop_oldest(self) -> None:
        """Delete the oldest file."""
        _, spill_file = self._files.popitem(last=False)
        os.close(spill_file.fd)
        spill_file.path.unlink(missing_ok=True)
        self.bytes -= spill_file.size

    def put(self, key: Hashable, frames: Mapping[str, np.ndarray]) -> dict[str, SpilledFrames] | None:
        """Write an entry's frames (camera -> uint8 [T, ...]); where each camera's went, or None when the
        disk refused the write (said once; the entry stays where it was)."""
        nbytes = sum(int(f.nbytes) for f in frames.values())
        spill_file = self._file_with_room(nbytes)
        where, start = {}, spill_file.size
        try:
            for cam, values in frames.items():
                values = np.ascontiguousarray(values, dtype=np.uint8)
                _write_all(spill_file.fd, memoryview(values).cast("B"), spill_file.size)
                where[cam] = SpilledFrames(str(spill_file.path), spill_file.size, len(values), values.shape[1:])
                spill_file.size += values.nbytes
        except OSError as exc:
            spill_file.size = start
            self.failed = f"{type(exc).__name__}: {exc}"
            log.error("the sampling index's frame spill at %s failed (%s); frames that leave memory from now on are "
                      "read back from the dataset's files instead", self.directory, self.failed)
            return None
        spill_file.keys.append(key)
        self.bytes += nbytes
        return where

    def _file_with_room(self, nbytes: int) -> _SpillFile:
        newest = next(reversed(self._files.values()), None)
        if newest is not None and newest.size + nbytes <= self.file_bytes:
            return newest
        path = self.directory / f"frames-{self._next_file:06d}.bin"
        spill_file = _SpillFile(path, os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600))
        self._files[self._next_file] = spill_file
        self._next_file += 1
        return spill_file

    def close(self) -> None:
        while self._files:
            self.drop_oldest()


def _write_all(fd: int, data: memoryview, offset: int) -> None:
    while len(data):
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def read_all_spilled(where: SpilledFrames) -> np.ndarray:
    """All of an entry's frames of one camera, uint8 [count, *frame_shape], in one read."""
    frames = np.empty((where.count, *where.frame_shape), dtype=np.uint8)
    fd = os.open(where.path, os.O_RDONLY)
    try:
        got = os.preadv(fd, [frames], where.offset)
    finally:
        os.close(fd)
    if got != frames.nbytes:
        raise OSError(f"{where.path}: {got} of {frames.nbytes} bytes of a spilled entry (a spill file cut short)")
    return frames


def read_spilled(wanted: Sequence[tuple[SpilledFrames, int]]) -> list[np.ndarray]:
    """Frame ``number`` of each ``(where, number)``, in order. ``FileNotFoundError`` when a file was
    dropped since ``where`` was handed out (the caller draws its batch again)."""
    out: list[np.ndarray] = []
    fds: dict[str, int] = {}
    try:
        for where, number in wanted:
            if not 0 <= number < where.count:
                raise IndexError(f"frame {number} of a spilled entry of {where.count} frames")
            fd = fds.get(where.path)
            if fd is None:
                fd = fds[where.path] = os.open(where.path, os.O_RDONLY)
            frame = np.empty(where.frame_shape, dtype=np.uint8)
            got = os.preadv(fd, [frame], where.offset + number * where.frame_bytes)
            if got != frame.nbytes:
                raise OSError(f"{where.path}: {got} of {frame.nbytes} bytes of frame {number} (a spill file cut short)")
            out.append(frame)
    finally:
        for fd in fds.values():
            os.close(fd)
    return out
