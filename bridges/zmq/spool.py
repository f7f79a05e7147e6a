"""The edge's on-disk spool of segments the learner has not acknowledged yet.

Why: a robot must not lose an episode because the network dropped, the learner
restarted, or the edge process crashed. Every segment is written here (fsynced)
before it is sent, and forgotten only when the learner acks it; whatever is still
pending is re-sent after a reconnect or a restart.

Format: one append-only log file, ``spool.log``, of records::

    magic "RRSP" | kind u8 (1 append, 2 ack) | key_len u16 | body_len u64 | crc32 u32 | key | body

The crc covers everything but itself. On open the log is scanned; a record that is
incomplete or fails its crc (a write torn by a crash, a garbled sector) does not end
the log: the scan resynchronises at the next offset where a whole record with a valid
crc starts (the magic is searched, the crc decides), so one bad record costs that
record and no other. The bad bytes are moved aside to ``corrupt-<offset>.bin``; a bad
tail is cut off, a bad region in the middle is removed by rewriting the log.

A failed write (a full disk, an I/O error) is undone: the file is cut back to its last
whole record, so the next append lands where the index expects it, and the error is
raised to the caller (which keeps the segment and retries). ``max_bytes`` bounds the
log: an append that would pass it raises ``SpoolFullError`` and the oldest records
stay (they are what the learner has waited for longest).

A segment the learner refuses as malformed (``refused``) is moved aside: ``set_aside`` writes its
frames and the reason to ``refused/`` beside the log (fsynced, in the body format of a record) and
forgets it here, so it neither waits for an ack that never comes nor is lost.

Appends are fsynced; ``append(..., sync=False)`` + ``sync()`` groups several appends
under one fsync (group commit: none of them counts as durable before ``sync`` returns).
Acks are not (a lost ack only means one duplicate re-send, which the learner drops).
When everything is acked the log is truncated to zero; when acked records dominate a
big log it is rewritten (tmp file + atomic rename). The spool is used by one thread of
one process (an exclusive flock enforces the process part).
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

_MAGIC = b"RRSP"
_HEADER = struct.Struct("<4sBHQI")  # magic, kind, key_len, body_len, crc32
_APPEND, _ACK = 1, 2
_FRAME_LEN = struct.Struct("<Q")
_COUNT = struct.Struct("<I")
LOG_NAME = "spool.log"
REFUSED_DIR = "refused"  # segments no learner will store, each EPISODE-SEQ.segment with EPISODE-SEQ.reason
# The edge's bound on unacked segments: ~7 h of a learner outage at the ~160 kB/s one robot with two
# cameras streams. Past it new segments wait in memory, then are refused (the operator is told, the
# local recording goes on); the oldest, which the learner has waited for longest, stay.
DEFAULT_SPOOL_MAX_BYTES = 4 << 30


class SpoolError(RuntimeError):
    """The spool cannot be used (locked by another process, bad key...)."""


class SpoolFullError(SpoolError):
    """The spool holds ``max_bytes`` of unacknowledged records; nothing more until the learner acks some."""


def _pack_frames(frames: Sequence[bytes | memoryview]) -> bytes:
    """count u32, then each frame as len u64 + bytes."""
    parts: list[bytes | memoryview] = [_COUNT.pack(len(frames))]
    for frame in frames:
        view = memoryview(frame).cast("B")
        parts += [_FRAME_LEN.pack(view.nbytes), view]
    return b"".join(parts)


def _unpack_frames(body: bytes) -> list[bytes]:
    (count,) = _COUNT.unpack_from(body, 0)
    pos, frames = _COUNT.size, []
    for _ in range(count):
        (length,) = _FRAME_LEN.unpack_from(body, pos)
        pos += _FRAME_LEN.size
        frames.append(body[pos : pos + length])
        pos += length
    return frames


def _record(kind: int, key: bytes, body: bytes) -> bytes:
    unsigned = _HEADER.pack(_MAGIC, kind, len(key), len(body), 0)[:-4]
    crc = zlib.crc32(body, zlib.crc32(key, zlib.crc32(unsigned)))
    return unsigned + struct.pack("<I", crc) + key + body


def _parse_record(fd: int, pos: int, size: int) -> tuple[int, str, int, int, int] | None:
    """(kind, key, body offset, body length, end offset) of the record at ``pos``, or None if torn/corrupt."""
    header = os.pread(fd, _HEADER.size, pos)
    if len(header) < _HEADER.size:
        return None
    magic, kind, key_len, body_len, crc = _HEADER.unpack(header)
    end = pos + _HEADER.size + key_len + body_len
    if magic != _MAGIC or kind not in (_APPEND, _ACK) or end > size:
        return None
    rest = os.pread(fd, key_len + body_len, pos + _HEADER.size)
    if len(rest) != key_len + body_len or zlib.crc32(rest, zlib.crc32(header[:-4])) != crc:
        return None
    try:
        key = rest[:key_len].decode("utf-8")
    except UnicodeDecodeError:
        return None
    return kind, key, pos + _HEADER.size + key_len, body_len, end


class SpoolReader:
    """Records a spool held when this was made, readable from another thread while the spool goes on
    appending, acking and compacting (``Spool.reader``).

    It reads through a duplicate of the log's descriptor: a compaction renames a new log over the
    path and closes the old one, and this keeps reading the old file. A record the spool has since
    released and overwritten (an all-acked log is cut to zero and filled again) no longer parses
    with its key at its place: ``read`` gives None for it, never another record's bytes."""

    def __init__(self, fd: int, places: dict[str, int]) -> None:
        self._fd = os.dup(fd)
        self._places = places  # key -> offset of its append record

    def keys(self) -> list[str]:
        return list(self._places)

    def read(self, key: str) -> list[bytes] | None:
        place = self._places.get(key)
        if place is None or self._fd < 0:
            return None
        parsed = _parse_record(self._fd, place, os.fstat(self._fd).st_size)
        if parsed is None or parsed[0] != _APPEND or parsed[1] != key:
            return None
        return _unpack_frames(os.pread(self._fd, parsed[3], parsed[2]))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class Spool:
    """Crash-safe FIFO of (key, frames) records awaiting acknowledgement.

    >>> spool = Spool("/var/lib/robot_rl/spool")
    >>> spool.append("ep12:0", frames)      # durable when this returns
    >>> for key, frames in spool.pending(): resend(frames)
    >>> spool.ack("ep12:0")
    """

    def __init__(self, directory: str | os.PathLike[str], *, fsync: bool = True, compact_min_bytes: int = 64 << 20,
                 max_bytes: int | None = None):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / LOG_NAME
        self._fsync = fsync
        self._compact_min_bytes = compact_min_bytes
        self.max_bytes = max_bytes
        self.write_errors = 0  # writes that failed and were undone (full disk, I/O errors)
        self.corrupt_regions: list[tuple[int, int]] = []  # (offset, length) skipped by the last scan
        self._pending: dict[str, tuple[int, int]] = {}  # key -> (body offset, body length), in append order
        self._size = 0
        self._live_bytes = 0  # bytes of records still pending
        self._unsynced = False  # appends written but not yet fsynced (group commit)
        self._fd = self._open_locked()
        try:
            self._recover()
        except BaseException:
            self.close()  # a spool that cannot open holds no lock and no descriptor
            raise

    # ------------------------------------------------------------ public API

    def append(self, key: str, frames: Sequence[bytes | memoryview], *, sync: bool = True) -> None:
        """Store ``frames`` under ``key``; durable (fsynced) when this returns.

        ``sync=False``: written but not fsynced; durable only once ``sync()`` returns (group
        commit: several appends, one fsync). Until then it must not be acknowledged to anyone.
        """
        if key in self._pending:
            raise SpoolError(f"spool key {key!r} is already pending; keys must be unique until acked")
        raw_key = self._key_bytes(key)
        body = _pack_frames(frames)
        record = _record(_APPEND, raw_key, body)
        if self.max_bytes is not None and self._live_bytes + len(record) > self.max_bytes:
            raise SpoolFullError(f"spool {self.path} holds {self._live_bytes} bytes the learner has not acked; "
                                 f"another {len(record)} would pass its limit of {self.max_bytes}")
        self._unsynced = self._unsynced or not sync
        self._write(record, sync=sync and self._fsync)
        if sync:
            self._unsynced = False  # this fsync covered the earlier unsynced appends too
        self._pending[key] = (self._size - len(body), len(body))
        self._live_bytes += len(record)

    def sync(self) -> None:
        """Make every append so far durable (one fsync; nothing to do if all are already)."""
        if self._unsynced:
            self._sync()
            self._unsynced = False

    def ack(self, key: str) -> bool:
        """Forget ``key``. Returns False if it was not pending (e.g. a duplicate ack)."""
        entry = self._pending.pop(key, None)
        if entry is None:
            return False
        self._live_bytes -= _HEADER.size + len(self._key_bytes(key)) + entry[1]
        try:
            self._write(_record(_ACK, self._key_bytes(key), b""), sync=False)
            self._maybe_compact()
        except OSError as exc:  # a lost ack record costs one duplicate re-send after a restart, nothing more
            log.warning("spool %s: cannot record the ack of %s (%s); it may be re-sent once after a restart",
                        self.path, key, exc)
        return True

    def set_aside(self, key: str, reason: str, frames: Sequence[bytes | memoryview] | None = None) -> Path:
        """Move the record ``key`` (or ``frames``, never spooled) to ``refused/`` with ``reason``, and
        forget it here. Returns the segment's file; ``KeyError`` if ``key`` is not pending and no
        ``frames`` are given. Written and fsynced before the record is forgotten: a crash in between
        leaves it in both places, never in neither."""
        if frames is None:
            frames = self.get(key)
            if frames is None:
                raise KeyError(f"spool {self.path}: no pending record {key!r} to set aside")
        name = "".join(c if c.isalnum() or c in "-_." else "-" for c in key)
        folder = self.directory / REFUSED_DIR
        folder.mkdir(exist_ok=True)
        target = folder / f"{name}.segment"
        for path, data in ((target, _pack_frames(frames)), (folder / f"{name}.reason", reason.encode() + b"\n")):
            with open(path, "wb") as f:
                f.write(data)
                f.flush()
                if self._fsync:
                    os.fsync(f.fileno())
        self._sync_dir(folder)
        self.ack(key)
        return target

    def refused(self) -> dict[str, str]:
        """The segments set aside so far (this run and earlier ones): file stem -> reason."""
        folder = self.directory / REFUSED_DIR
        if not folder.is_dir():
            return {}
        return {path.stem: path.read_text(errors="replace").strip() for path in sorted(folder.glob("*.reason"))}

    def pending(self) -> Iterator[tuple[str, list[bytes]]]:
        """Unacked records, oldest first. Safe to ``ack`` while iterating."""
        for key in list(self._pending):
            entry = self._pending.get(key)
            if entry is not None:
                offset, length = entry
                yield key, _unpack_frames(os.pread(self._fd, length, offset))

    def get(self, key: str) -> list[bytes] | None:
        entry = self._pending.get(key)
        return None if entry is None else _unpack_frames(os.pread(self._fd, entry[1], entry[0]))

    def keys(self) -> list[str]:
        return list(self._pending)

    def reader(self, keys: Sequence[str]) -> SpoolReader:
        """A view of these pending records that another thread may read without this spool's lock."""
        return SpoolReader(self._fd, {key: self._pending[key][0] - len(self._key_bytes(key)) - _HEADER.size
                                      for key in keys if key in self._pending})

    def iter_keys(self) -> Iterator[str]:
        """Pending keys, oldest first, without copying them all: for a caller that stops after the
        first few. Nothing may be appended or acked while it iterates."""
        return iter(self._pending)

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, key: object) -> bool:
        return key in self._pending

    @property
    def size_bytes(self) -> int:
        return self._size

    def compact(self) -> None:
        """Rewrite the log with only pending records (atomic: tmp file + rename)."""
        if not self._pending:
            # No fsync needed: if a crash undoes the truncation, the log still
            # holds every append and (most) acks; at worst a few duplicates resend.
            os.ftruncate(self._fd, 0)
            self._size = self._live_bytes = 0
            return
        tmp = self.directory / (LOG_NAME + ".tmp")
        try:
            with open(tmp, "wb") as f:
                for key, (offset, length) in self._pending.items():
                    f.write(_record(_APPEND, self._key_bytes(key), os.pread(self._fd, length, offset)))
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            tmp.unlink(missing_ok=True)  # the log itself is untouched
            raise
        os.replace(tmp, self.path)
        self._sync_dir()
        os.close(self._fd)
        self._fd = self._open_locked()
        self._recover()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # releases the flock
            self._fd = -1

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ internals

    @staticmethod
    def _key_bytes(key: str) -> bytes:
        raw = key.encode("utf-8")
        if not raw or len(raw) > 0xFFFF:
            raise SpoolError(f"spool keys must be 1..65535 bytes of UTF-8, got {len(raw)} bytes")
        return raw

    def _open_locked(self) -> int:
        created = not self.path.exists()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            raise SpoolError(f"spool {self.path} is in use by another process; "
                             "give each edge node its own directory") from exc
        if created:
            self._sync_dir()
        return fd

    def _write(self, data: bytes, *, sync: bool) -> None:
        try:
            written = os.write(self._fd, data)
            while written < len(data):  # short writes are legal for os.write
                written += os.write(self._fd, data[written:])
        except OSError:
            self.write_errors += 1
            # Cut back to the last whole record: the next append must start where the index expects it.
            os.ftruncate(self._fd, self._size)
            raise
        self._size += len(data)
        if sync:
            self._sync()

    def _sync(self) -> None:
        if self._fsync:
            os.fsync(self._fd)

    def _sync_dir(self, directory: Path | None = None) -> None:
        if self._fsync:
            dfd = os.open(directory or self.directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

    def _recover(self) -> None:
        """Rebuild the pending index from the log, one record at a time, past any bad record."""
        self._pending.clear()
        size = os.fstat(self._fd).st_size
        pos, live = 0, {}
        self.corrupt_regions = []
        while pos < size:
            parsed = _parse_record(self._fd, pos, size)
            if parsed is None:
                start, pos = pos, self._next_record(pos + 1, size)
                self.corrupt_regions.append((start, pos - start))
                continue
            kind, key, body_off, body_len, end = parsed
            if kind == _APPEND:
                self._pending[key] = (body_off, body_len)
                live[key] = end - pos
            else:
                self._pending.pop(key, None)
                live.pop(key, None)
            pos = end
        self._size = size
        self._live_bytes = sum(live.values())
        if self.corrupt_regions:
            self._set_corrupt_regions_aside()
        if self._pending:
            log.info("spool %s: %d unacked segment(s) to re-send", self.path, len(self._pending))

    def _next_record(self, start: int, size: int) -> int:
        """The first offset >= ``start`` where a whole, crc-valid record begins; ``size`` if none."""
        window = 1 << 20
        pos = start
        while pos < size:
            chunk = os.pread(self._fd, window + len(_MAGIC) - 1, pos)
            hit = chunk.find(_MAGIC)
            while hit != -1:
                if _parse_record(self._fd, pos + hit, size) is not None:
                    return pos + hit
                hit = chunk.find(_MAGIC, hit + 1)
            pos += window
        return size

    def _set_corrupt_regions_aside(self) -> None:
        """Save every bad region's bytes beside the log, then drop them from it: a bad tail (a write
        torn by a crash) is cut off; a bad region between good records means rewriting the log."""
        for offset, length in self.corrupt_regions:
            aside = self.directory / f"corrupt-{offset}.bin"
            aside.write_bytes(os.pread(self._fd, length, offset))
            log.warning("spool %s: %d bytes at byte %d are no whole record (a torn write or a garbled sector); "
                        "the records around them are kept, the bytes moved to %s", self.path, length, offset, aside)
        offset, length = self.corrupt_regions[-1]
        if len(self.corrupt_regions) == 1 and offset + length == self._size:
            os.ftruncate(self._fd, offset)
            self._size = offset
            self._sync()
        else:
            regions = self.corrupt_regions
            self.compact()  # rewrites the pending records only, then scans the clean log again
            self.corrupt_regions = regions

    def _maybe_compact(self) -> None:
        if not self._pending:
            self.compact()  # cheap: truncate to zero
        elif self._size >= self._compact_min_bytes and self._live_bytes * 2 < self._size:
            self.compact()
