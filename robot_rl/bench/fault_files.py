"""Damaged files for ``robot-rl bench faults``: what a bad disk, a bad copy or a full disk leaves.

Each case builds its files in a directory of its own, damages them, and says whether the product
handled it: a damaged checkpoint refused on resume with one clear error, a spool that keeps every
record the damage did not touch, a write that failed half way leaving every other record intact, a
learner whose disk fills up under its store (``fault_store.py``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np


def _checkpoint(root: Path) -> tuple[Callable[[], object], Path]:
    """A trainer with one checkpoint; returns (resume on a fresh trainer, the checkpoint's weights file)."""
    from robot_rl.bench.transport import CAMERAS, ballast_policy
    from robot_rl.learner.algorithms.config import WeightedBCConfig
    from robot_rl.learner.config import TrainerConfig
    from robot_rl.learner.index import SamplingIndex
    from robot_rl.learner.trainer import Trainer

    config = TrainerConfig(device="cpu", log_dir="", checkpoint_dir=str(root / "ckpt"))
    trainer = Trainer(ballast_policy(0.0), SamplingIndex(CAMERAS), config, WeightedBCConfig())
    path = trainer.checkpoint()
    return (lambda: Trainer(ballast_policy(0.0), SamplingIndex(CAMERAS), config, WeightedBCConfig()).resume(
                check_index=False),
            path / "model.safetensors")


def _refused_on_resume(root: Path, damage: Callable[[Path], None]) -> bool:
    from robot_rl.core.errors import ConfigError

    resume, weights = _checkpoint(root)
    damage(weights)
    try:
        resume()
    except ConfigError:
        return True
    return False


def _nan_bytes(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(max(0, path.stat().st_size // 2 - 2048))
        f.write(np.full(1024, np.nan, np.float32).tobytes())


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def _records(n: int) -> list[list[bytes]]:
    return [[f"envelope-{i}".encode(), bytes([i % 256]) * (100 + i)] for i in range(n)]


def _garbled_spool_keeps_the_rest(root: Path) -> bool:
    from robot_rl.bridges.zmq.spool import Spool

    with Spool(root) as spool:
        ends = []
        for i, frames in enumerate(_records(9)):
            spool.append(f"1:{i}", frames)
            ends.append(spool.size_bytes)
    with open(root / "spool.log", "r+b") as f:  # 4 bytes inside record 1
        f.seek(ends[0] + 40)
        f.write(b"\xde\xad\xbe\xef")
    with Spool(root) as spool:
        return spool.keys() == [f"1:{i}" for i in range(9) if i != 1]


def _failed_write_child(root: str) -> None:
    """A real short write: the file-size limit (RLIMIT_FSIZE) stops a record half way, as a full disk
    does; the spool must cut it back, and the retry (with room again) and later records must land."""
    import resource
    import signal
    import sys

    from robot_rl.bridges.zmq.spool import Spool

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
    records = _records(4)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    with Spool(root) as spool:
        spool.append("1:0", records[0])
        resource.setrlimit(resource.RLIMIT_FSIZE, (spool.size_bytes + 60, hard))
        try:
            spool.append("1:1", records[1])
        except OSError:
            pass
        else:
            sys.exit(2)  # the limit did not bite: nothing was tested
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        spool.append("1:1", records[1])
        spool.append("1:2", records[2])
    with Spool(root) as spool:
        sys.exit(0 if [spool.get(f"1:{i}") for i in range(3)] == records[:3] and not spool.corrupt_regions else 1)


def _failed_write_keeps_the_rest(root: Path) -> bool:
    import multiprocessing

    child = multiprocessing.get_context("spawn").Process(target=_failed_write_child, args=(str(root),))
    child.start()
    child.join(120)
    return child.exitcode == 0


def file_faults(root: Path) -> dict[str, bool]:
    """case -> handled."""
    from robot_rl.bench.fault_store import full_disk_under_the_store

    cases: dict[str, Callable[[Path], bool]] = {
        "checkpoint_with_nan_bytes": lambda d: _refused_on_resume(d, _nan_bytes),
        "truncated_checkpoint": lambda d: _refused_on_resume(d, _truncate),
        "garbled_spool_record": _garbled_spool_keeps_the_rest,
        "full_disk_mid_write": _failed_write_keeps_the_rest,
        "learner_store_full_disk": full_disk_under_the_store,
    }
    results = {}
    for name, case in cases.items():
        directory = root / name
        directory.mkdir(parents=True)
        results[name] = bool(case(directory))
    return results
