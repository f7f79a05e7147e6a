"""Push checkpoints and the replay store to the Hugging Face Hub, on a schedule, off the trainer's path.

Why a background thread: an upload takes seconds to hours and may fail (network, token,
quota). The trainer only calls ``notify_checkpoint`` (a lock and a counter); the pusher
thread wakes every ``poll_s``, and when a push is due (``every_checkpoints`` new
checkpoints or ``every_minutes`` since the last attempt) it uploads:

* the newest checkpoint, to the model repo ``checkpoints_repo_id`` under ``step-XXXXXXXX/``,
  from a hard-linked snapshot (the trainer may prune the original meanwhile);
* the replay store's LeRobotDataset, to the dataset repo ``store_repo_id``, from a copy
  taken while no episode was being written (so the Hub never gets a half-written file).

A failed push is logged with the repo and the reason and tried again at the next
scheduled time; training never notices. Off by default (``learner.hub.enabled``).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from robot_rl.learner.config import HubConfig

log = logging.getLogger(__name__)

SnapshotFn = Callable[[Path], bool]  # copy something consistent into the given dir; False if it could not


@dataclass
class PushStats:
    pushes: int = 0
    failures: int = 0
    last_error: str = ""
    checkpoints_pushed: tuple[str, ...] = ()


class HubSchedule:
    """Due after ``every_checkpoints`` new checkpoints or ``every_minutes`` since the last attempt."""

    def __init__(self, every_checkpoints: int, every_minutes: float, clock: Callable[[], float]) -> None:
        self.every_checkpoints = every_checkpoints
        self.every_s = every_minutes * 60.0
        self.clock = clock
        self._new_checkpoints = 0
        self._last_attempt_s = clock()

    def note_checkpoint(self) -> None:
        self._new_checkpoints += 1

    def due(self) -> bool:
        by_count = self.every_checkpoints > 0 and self._new_checkpoints >= self.every_checkpoints
        by_time = self.every_s > 0 and self.clock() - self._last_attempt_s >= self.every_s
        return by_count or by_time

    def attempted(self) -> None:
        """Success or failure, the next try waits for the next scheduled time."""
        self._new_checkpoints = 0
        self._last_attempt_s = self.clock()


def link_or_copy_tree(src: Path, dest: Path) -> None:
    """Hard links where the filesystem allows (instant, immune to the original being deleted), else copies."""
    def link(s: str, d: str) -> None:
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    shutil.copytree(src, dest, copy_function=link)


def dataset_snapshot(store: Any, attempts: int = 3) -> SnapshotFn:
    """A ``SnapshotFn`` copying ``store``'s dataset while no episode commit ran.

    Optimistic: copy, then check that the store was idle before and after and that the
    number of stored episodes did not change; otherwise try again (up to ``attempts``).
    """
    def snapshot(dest: Path) -> bool:
        for _ in range(attempts):
            if not store.flush(30.0):
                continue
            before = store.stats()["episodes_stored"]
            if before == 0 or not store.dataset_root.exists():
                return False
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(store.dataset_root, dest)  # real copies: lerobot may rewrite files in place
            if store.flush(0.0) and store.stats()["episodes_stored"] == before:
                return True
        log.warning("hub: the replay store kept writing episodes during %d snapshot attempts; "
                    "its push waits for the next scheduled time", attempts)
        return False

    return snapshot


class HubPusher:
    """``pusher = HubPusher(config, store_snapshot).start(); trainer(on_checkpoint=pusher.notify_checkpoint)``."""

    def __init__(self, config: HubConfig, store_snapshot: SnapshotFn | None = None, *, api: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not config.enabled:
            raise ValueError("HubPusher needs learner.hub.enabled=true")
        self.config = config
        self.store_snapshot = store_snapshot
        self.schedule = HubSchedule(config.every_checkpoints, config.every_minutes, clock)
        self.stats = PushStats()
        self._api = api
        self._latest: Path | None = None
        self._pushed: Path | None = None
        self._repos_created: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ trainer side: never waits

    def notify_checkpoint(self, path: Path) -> None:
        with self._lock:
            self._latest = Path(path)
            self.schedule.note_checkpoint()
            if self.schedule.due():
                self._wake.set()

    # ------------------------------------------------------------ lifecycle

    def start(self) -> HubPusher:
        self._thread = threading.Thread(target=self._run, name="hub-push", daemon=True)
        self._thread.start()
        return self

    def stop(self, final_push: bool = True, timeout_s: float = 600.0) -> None:
        """Stop the thread; with ``final_push``, push what is new once more (bounded by ``timeout_s``)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.error("hub push still running after %.0f s; leaving it behind", timeout_s)
                return
        if final_push and self._has_news():
            self.push_now()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.config.poll_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            with self._lock:
                due = self.schedule.due()
            if due:
                self.push_now()

    def _has_news(self) -> bool:
        with self._lock:
            return self._latest != self._pushed or self.store_snapshot is not None

    # ------------------------------------------------------------ one push

    def push_now(self) -> bool:
        """Push the newest checkpoint and a store snapshot; True if everything went up."""
        with self._lock:
            self.schedule.attempted()
            checkpoint = self._latest if self._latest != self._pushed else None
        ok = True
        if checkpoint is not None and self.config.checkpoints_repo_id:
            ok &= self._guarded(f"checkpoint {checkpoint.name}", self.config.checkpoints_repo_id,
                                lambda: self._push_checkpoint(checkpoint))
        if self.store_snapshot is not None and self.config.store_repo_id:
            ok &= self._guarded("replay store", self.config.store_repo_id, self._push_store)
        if ok:
            self.stats.pushes += 1
        return ok

    def _guarded(self, what: str, repo_id: str, push: Callable[[], None]) -> bool:
        try:
            push()
            return True
        except Exception as exc:  # noqa: BLE001 - any failure: report, keep training, retry next time
            self.stats.failures += 1
            self.stats.last_error = f"{type(exc).__name__}: {exc}"
            log.error("hub: pushing the %s to %s failed (%s); training continues and the push is retried "
                      "at the next scheduled time (every %d checkpoints / %.0f min). Check the token "
                      "(HF_TOKEN or `huggingface-cli login`), the repo id and the network.",
                      what, repo_id, self.stats.last_error, self.config.every_checkpoints, self.config.every_minutes)
            return False

    def _push_checkpoint(self, checkpoint: Path) -> None:
        repo = self.config.checkpoints_repo_id
        assert repo is not None
        with tempfile.TemporaryDirectory(prefix="hub-ckpt-") as tmp:
            snapshot = Path(tmp) / checkpoint.name
            link_or_copy_tree(checkpoint, snapshot)  # raises if the trainer already pruned it
            self._ensure_repo(repo, "model")
            self.api.upload_folder(repo_id=repo, repo_type="model", folder_path=str(snapshot),
                                   path_in_repo=checkpoint.name,
                                   commit_message=f"robot_rl learner checkpoint {checkpoint.name}")
        with self._lock:
            self._pushed = checkpoint
        self.stats.checkpoints_pushed += (checkpoint.name,)
        log.info("hub: pushed checkpoint %s to %s", checkpoint.name, repo)

    def _push_store(self) -> None:
        repo = self.config.store_repo_id
        assert repo is not None and self.store_snapshot is not None
        with tempfile.TemporaryDirectory(prefix="hub-store-") as tmp:
            folder = Path(tmp) / "dataset"
            if not self.store_snapshot(folder):
                log.info("hub: no consistent replay-store snapshot yet (empty, or busy); skipped this time")
                return
            self._ensure_repo(repo, "dataset")
            self.api.upload_folder(repo_id=repo, repo_type="dataset", folder_path=str(folder),
                                   commit_message="robot_rl replay store snapshot")
        log.info("hub: pushed the replay store to %s", repo)

    @property
    def api(self) -> Any:
        if self._api is None:
            from huggingface_hub import HfApi

            self._api = HfApi(token=self.config.token)
        return self._api

    def _ensure_repo(self, repo_id: str, repo_type: str) -> None:
        if (repo_id, repo_type) in self._repos_created:
            return
        self.api.create_repo(repo_id=repo_id, repo_type=repo_type, private=self.config.private, exist_ok=True)
        self._repos_created.add((repo_id, repo_type))
