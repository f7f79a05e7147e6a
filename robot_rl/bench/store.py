"""`robot-rl bench store`: how fast the learner's dataset writer catches up, and what it leaves the trainer.

Why it matters: on a shared CPU the writer falls behind the robots (it lagged 7-15 minutes
in the 10-minute learning arms before ``commit_batch``), and every second it spends is taken from the trainer. The
cost of one episode is LeRobot's own: re-opening the dataset (``resume``), encoding and
embedding its images, finalizing. Episodes that queue up can share one open/finalize
(``store.commit_batch``).

What runs: the real ``ReplayStore`` with its background writer. ``episodes`` finished
episodes (300 steps, two 96x96 cameras, synthetic camera-like frames) are ingested as the
edge would stream them, as fast as the store takes them, so they queue for the writer the
way they do behind a lagging writer; the clock runs from the first ingest until every
episode is in the finalized dataset (``flush``). Each setting writes a fresh dataset, the
settings run one after the other in one process (compare the ratio, not absolute numbers).

Settings: ``store.commit_batch`` (queued episodes per open/finalize) and ``store.writer`` (in
the learner's process or its own). Beside the writer a probe thread trains a small MLP with one
PyTorch thread, as the learner's trainer does in ``robot-rl run``; its speed during the
writing, over its speed alone just before (``probe_speed``), stands for the share of a trainer the
writer leaves: a proxy, not the project's trainer (the writer in the learner's process also takes
the trainer's GIL, in its own process only CPU).
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from robot_rl.bench.config import StoreBenchConfig
from robot_rl.bench.progress import timed_run
from robot_rl.bench.transport import CAMERAS, IMAGE, JOINTS, SEGMENT_STEPS, synthetic_steps

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig

log = logging.getLogger(__name__)
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # lerobot's writer would print a bar per episode
warnings.filterwarnings("ignore", message="Cannot enable progress bars")  # lerobot re-enables them per episode


class TrainerProbe:
    """A thread doing small training steps (a 3-layer MLP, forward, backward, AdamW): like the
    trainer, it computes outside the GIL and needs it between ops, so its rate shows how much of
    a trainer's speed the writer leaves."""

    def __init__(self) -> None:
        import torch

        torch.manual_seed(0)
        self._model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                          torch.nn.ReLU(), torch.nn.Linear(256, 256))
        self._optimizer = torch.optim.AdamW(self._model.parameters(), lr=1e-4)
        self._batch = torch.randn(64, 256)
        self._steps = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-probe", daemon=True)
        self._started = 0.0
        self._rate = 0.0

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._model(self._batch).square().mean().backward()
            self._optimizer.step()
            self._optimizer.zero_grad()
            self._steps += 1

    def start(self) -> None:
        self._started = time.monotonic()
        self._thread.start()

    def stop(self) -> float:
        """Steps per second from ``start`` to the first ``stop``."""
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join()
            self._rate = self._steps / max(time.monotonic() - self._started, 1e-9)
        return self._rate

    @classmethod
    def rate_alone(cls, seconds: float = 3.0) -> float:
        probe = cls()
        probe.start()
        time.sleep(seconds)
        return probe.stop()


def writer_seconds(batch: int, cfg: StoreBenchConfig, root: Path, writer: str = "thread") -> dict[str, Any]:
    """Wall seconds until ``cfg.episodes`` queued episodes are in the finalized dataset, and the
    speed a training thread kept meanwhile (over its speed alone)."""
    from robot_rl.bridges.zmq.segments import ImageEncoding, encode_segment
    from robot_rl.learner.config import StoreConfig
    from robot_rl.learner.store import ReplayStore

    config = StoreConfig(root=str(root), fps=30, joint_names=JOINTS, cameras=CAMERAS, image_height=IMAGE,
                         image_width=IMAGE,
                         background_commit=True, commit_batch=batch, writer=writer)
    segments = []
    for episode in range(cfg.episodes):
        steps = synthetic_steps(cfg.episode_steps, episode, seed=episode)
        chunks = [steps[i:i + SEGMENT_STEPS] for i in range(0, len(steps), SEGMENT_STEPS)]
        segments += [encode_segment("bench", episode, seq, chunk, episode_done=chunk[-1].done,
                                    image_encoding=ImageEncoding("jpeg"))
                     for seq, chunk in enumerate(chunks)]
    store = ReplayStore(config)
    alone = TrainerProbe.rate_alone()
    probe = TrainerProbe()
    try:
        probe.start()
        started = time.monotonic()
        for segment in segments:
            store.ingest(segment)
        ingested = time.monotonic() - started
        if not store.flush(timeout_s=3600):
            raise RuntimeError(f"bench store: the writer did not finish {cfg.episodes} episodes within an hour")
        total = time.monotonic() - started
        beside = probe.stop()
        stored = store.stats()["episodes_stored"]
    finally:
        probe.stop()
        store.close()
    if stored != cfg.episodes:
        raise RuntimeError(f"bench store: {stored} of {cfg.episodes} episodes stored")
    return {"writer": writer, "commit_batch": batch, "episodes": cfg.episodes, "ingest_s": round(ingested, 6),
            "total_s": round(total, 6), "s_per_episode": round(total / cfg.episodes, 3),
            "probe_speed": round(beside / alone, 3)}


def run_store_bench(cfg: StoreBenchConfig, progress: Any = print) -> dict[str, Any]:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the learner's setting in `robot-rl run` (run.torch_threads)
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
            for writer in cfg.writers:
                for batch in cfg.batches:
                    progress(f"writer {writer}, commit_batch {batch}: {cfg.episodes} episodes of "
                             f"{cfg.episode_steps} steps")
                    rows.append(writer_seconds(batch, cfg, Path(tmp) / f"{writer}-batch-{batch}", writer))
    finally:
        torch.set_num_threads(threads)
    base = rows[0]["s_per_episode"]
    for row in rows:
        row["speedup_vs_first"] = round(base / row["s_per_episode"], 2) if row["s_per_episode"] else None
    return {"rows": rows, "episode_steps": cfg.episode_steps, "cameras": list(CAMERAS), "image": IMAGE}


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"dataset writer: {report['rows'][0]['episodes']} queued episodes of "
                        f"{report['episode_steps']} steps, cameras {report['cameras']} at {report['image']} px")
    for col in ("writer", "commit_batch", "ingest s", "until all finalized s", "s / episode", "speed-up",
                "trainer proxy (MLP probe) speed beside it"):
        table.add_column(col, justify="right")
    for row in report["rows"]:
        table.add_row(row["writer"], str(row["commit_batch"]), f"{row['ingest_s']:.1f}", f"{row['total_s']:.1f}",
                      f"{row['s_per_episode']:.2f}", f"{row['speedup_vs_first']:.2f}x",
                      f"{row['probe_speed']:.0%}")
    Console().print(table)


def run_from_cli(cfg: RobotRLConfig) -> dict:
    report = timed_run(lambda progress: run_store_bench(cfg.bench, progress=progress))
    print_table(report)
    return report
