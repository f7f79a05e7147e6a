"""Files under /dev/shm that weight downloads are assembled into, reused from one version to the next.

Why reuse them: a fresh file's pages are allocated when they are first written, and on a machine
without transparent huge pages for shared memory that costs 0.6-0.9 s per gigabyte (writing 1 GB
into a new /dev/shm file: 0.7-0.94 s; into the same mapping again: 0.08 s). A VLA's versions all have one size,
so the file the policy process has finished loading is the next download's buffer. The policy
process maps a file only between ``stage`` and ``release``; the link writes one only between
``allocate`` and ``stage``, so no file is ever written while it is read.

Before the first download there is no released file yet, so ``prepare`` faults in one of the policy's
published size (plus room for the safetensors header) in the background, at low priority: the first
swap of a session then costs what later ones do. A file serves any download that fits in it with at
most ``HEADER_ROOM`` to spare (the policy process maps only the download's bytes of it), and each file
is made ``GROWTH_ROOM`` larger than its first download, for the header of a longer version number.

Files are named after the control process's pid; one a crashed edge left behind (its pid gone) is
removed when the next pool starts.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import re
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from robot_rl.bridges.zmq.weights import GROWTH_ROOM, fault_in, fits
from robot_rl.core.priority import lower_own_priority

log = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
PREFIX = "robot_rl-weights-"
# Free files kept for reuse: the one the policy process just released and the one before. A
# download is assembled while the previous version loads, so two alternate; more would only hold memory.
KEEP_FREE = 2
PREPARE_NICE = 10  # the prepared file is faulted in behind the control loop and the link
_NAME = re.compile(rf"^{re.escape(PREFIX)}(\d+)-")


@dataclass
class _File:
    path: Path
    mapping: mmap.mmap | None  # None for an empty payload


class WeightsFilePool:
    """Buffers for downloads (``allocate``), handed to the policy process by path (``stage``), and
    taken back once it has loaded them (``release``). Thread-safe: the link allocates, the control
    thread stages and releases."""

    def __init__(self, directory: Path = SHM_DIR) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._free: list[_File] = []
        self._lent: dict[int, _File] = {}  # id(mapping) -> file, being written by the link
        self._staged: dict[str, _File] = {}  # path -> file, being read by the policy process
        self.reused = 0  # allocations served by a file already written once (or prepared)
        self._preparing = False
        self._closed = False
        remove_stale_files(directory)

    @property
    def free(self) -> int:
        """Files ready for the next download."""
        return len(self._free)

    def allocate(self, size: int) -> memoryview:
        """A writable buffer of ``size`` bytes backed by a file the policy process can map."""
        with self._lock:
            match = next((f for f in self._free if _fits(f, size)), None)
            if match is not None:
                self._free.remove(match)
                self.reused += 1
                misfits: list[_File] = []
            else:  # another size: the model changed, and the free files of the old one go
                misfits, self._free = self._free, []
        for file in misfits:
            with contextlib.suppress(FileNotFoundError):
                file.path.unlink()
        file = match or self._create(size + GROWTH_ROOM if size else 0)
        if file.mapping is None:
            return memoryview(bytearray())
        with self._lock:
            self._lent[id(file.mapping)] = file
        return memoryview(file.mapping)[:size]

    def prepare(self, size: int) -> None:
        """Fault in a file of ``size`` bytes for the next download, on a thread of low priority (at most
        one at a time; nothing if a file is free already)."""
        with self._lock:
            if size <= 0 or self._preparing or self._free:
                return
            self._preparing = True
        threading.Thread(target=self._fault_in, args=(size,), name="weights-file-prepare", daemon=True).start()

    def _fault_in(self, size: int) -> None:
        lower_own_priority(PREPARE_NICE)
        file: _File | None = None
        try:
            file = self._create(size)
            assert file.mapping is not None
            fault_in(file.mapping)
            with self._lock:
                if not self._closed:
                    self._free.append(file)
                    file = None
        except (OSError, ValueError) as exc:  # /dev/shm full: the first download faults its own pages in
            log.warning("could not prepare a %d-byte weights file in %s: %s", size, self.directory, exc)
        finally:
            with self._lock:
                self._preparing = False
            if file is not None:  # not kept: closed meanwhile, or failed half-way
                with contextlib.suppress(FileNotFoundError):
                    file.path.unlink()

    def stage(self, view: memoryview) -> Path | None:
        """The file behind a buffer from ``allocate`` (None if it is not one), now the policy process's to read."""
        with self._lock:
            file = self._lent.pop(id(view.obj), None)
            if file is not None:
                self._staged[str(file.path)] = file
        return None if file is None else file.path

    def release(self, path: str) -> None:
        """The policy process is done with ``path``: kept for the next download, or removed."""
        with self._lock:
            file = self._staged.pop(path, None)
            if file is not None and file.mapping is not None and len(self._free) < KEEP_FREE:
                self._free.append(file)
                return
        # Not closed: the link may still hold a view of the mapping (closing it would raise on the
        # control thread); the pages go with the last view, the name now.
        with contextlib.suppress(FileNotFoundError):
            Path(path).unlink()

    def close(self) -> None:
        """Remove every file (the policy process is gone or going)."""
        with self._lock:
            self._closed = True  # a file still being prepared is removed when it is done
            files = self._free + list(self._lent.values()) + list(self._staged.values())
            self._free, self._lent, self._staged = [], {}, {}
        for file in files:
            with contextlib.suppress(FileNotFoundError):
                file.path.unlink()

    def _create(self, size: int) -> _File:
        path = Path(tempfile.mkstemp(prefix=f"{PREFIX}{os.getpid()}-", dir=self.directory)[1])
        with open(path, "r+b") as handle:
            handle.truncate(size)
            mapping = mmap.mmap(handle.fileno(), size) if size else None
        return _File(path, mapping)


def _fits(file: _File, size: int) -> bool:
    return file.mapping is not None and fits(len(file.mapping), size)


def remove_stale_files(directory: Path) -> list[Path]:
    """Remove weights files of control processes that no longer run (a crash leaves them behind)."""
    removed = []
    for path in directory.glob(f"{PREFIX}*"):
        found = _NAME.match(path.name)
        if found is None or _alive(int(found.group(1))):
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
    if removed:
        log.info("removed %d weights file(s) a stopped edge left in %s", len(removed), directory)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive, not ours to judge
        return True
    return True
