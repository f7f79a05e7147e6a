"""Write Episodes into a LeRobotDataset v3 with lerobot's own writer.

Crash safety: each episode is validated completely before its first frame is
buffered, then saved and (by default) finalized on its own, so a crash or a bad
episode can lose at most the episodes saved since the last finalize, never one
already finalized: opening a dataset whose last write was cut short rolls it back to
its last finalize (``repair.repair_interrupted_write``). The next episode re-opens the
dataset with ``LeRobotDataset.resume``, which costs a few seconds; writers that keep
their own copy until ``close()`` returns (the learner's staging log) or can simply
rerun (demonstrations) may finalize every N episodes instead (``finalize_every``).
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from robot_rl.core.types import Episode, Step, source_code
from robot_rl.data.features import EXTRA_COLUMNS, VERDICT_COLUMNS, dataset_features
from robot_rl.data.frame_storage import FrameStorageConfig
from robot_rl.data.repair import repair_interrupted_write

log = logging.getLogger(__name__)
# LeRobot's writer runs a `datasets` map per episode, each with a progress bar of its own: in
# `robot-rl run` they buried the live line. `datasets` reads this when it is first imported.
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
warnings.filterwarnings("ignore", message="Cannot enable progress bars")  # lerobot asks for them per episode
# LeRobot's dataset writer builds its default video encoder settings at every open, PNG datasets too,
# and each says at INFO which codec it found: two lines per stored batch that say nothing about it.
CODEC_LOGGER = "lerobot.configs.video"


class RecordingError(ValueError):
    """An episode that cannot be stored as it is; nothing of it was written."""


class EpisodeRecorder:
    """Appends Episodes to a LeRobotDataset v3 directory (created on first use)."""

    def __init__(
        self,
        root: str | Path,
        fps: int,
        joint_names: tuple[str, ...],
        cameras: dict[str, tuple[int, int]],
        repo_id: str = "local/robot_rl",
        robot_type: str = "so101",
        frames: FrameStorageConfig | None = None,
        finalize_every: int = 1,
    ) -> None:
        if finalize_every < 1:
            raise ValueError(f"finalize_every must be >= 1, got {finalize_every}")
        logging.getLogger(CODEC_LOGGER).setLevel(logging.WARNING)
        self.root = Path(root)
        self.finalize_every = finalize_every
        self._since_finalize = 0
        self.fps = int(fps)
        self.joint_names = tuple(joint_names)
        self.cameras = dict(cameras)
        self.repo_id = repo_id
        self.robot_type = robot_type
        self.frames = frames or FrameStorageConfig()
        self._dataset = None
        self._num_episodes: int | None = None
        existing = self.root / "meta" / "info.json"
        # A dataset that exists keeps its image layout: LeRobot appends in the layout it was created with.
        self.use_videos = _stores_video(existing) if existing.exists() else self.frames.use_videos(self.cameras)
        self.features = dataset_features(self.joint_names, self.cameras, self.use_videos)
        if existing.exists():
            self._check_existing_layout()
            stored = json.loads(existing.read_text()).get("features", {})
            self.features = {k: v for k, v in self.features.items() if k not in VERDICT_COLUMNS or k in stored}
            repair_interrupted_write(self.root)
        self._num_episodes = self._read_num_episodes()

    @property
    def num_episodes(self) -> int:
        """Episodes stored. Kept in memory: other threads ask while LeRobot rewrites info.json,
        and a read in the middle of that rewrite would see an empty file."""
        if self._num_episodes is None:
            self._num_episodes = self._read_num_episodes()
        return self._num_episodes

    def _read_num_episodes(self) -> int:
        info = self.root / "meta" / "info.json"
        if not info.exists():
            return 0
        return int(json.loads(info.read_text())["total_episodes"])

    def write_episode(self, episode: Episode, finalize: bool | None = None) -> int:
        """Store one episode; returns its index in the dataset.

        ``finalize``: True or False to finalize after this episode or not (``close()`` later);
        None: every ``finalize_every`` episodes.
        """
        if not episode.steps:
            raise RecordingError(f"episode {episode.episode_id} of {episode.robot_id} has no steps")
        # Every step checked before the dataset is touched: an edge's bad step leaves nothing half-added.
        seed = -1 if episode.seed is None else int(episode.seed)
        frames = [self._frame(step, episode.instruction, seed) for step in episode.steps]
        return self._write_frames(frames, finalize)

    def write_steps(self, instruction: str, seed: int | None, steps: Iterable[Step],
                    finalize: bool | None = None) -> int:
        """``write_episode`` for steps that arrive one after another (decoded as they are written): each
        step's frames go to the dataset, and may be let go, before the next is made, so a long episode of
        640x480 cameras is never in memory whole (10 s of two is 553 MB). A bad step ends the episode
        unsaved, as in ``write_episode``."""
        stored_seed = -1 if seed is None else int(seed)
        return self._write_frames((self._frame(step, instruction, stored_seed) for step in steps), finalize)

    def _write_frames(self, frames: Iterable[dict], finalize: bool | None) -> int:
        dataset = self._dataset or self._open()
        self._dataset = dataset
        try:
            added = 0
            for frame in frames:
                dataset.add_frame(frame)
                added += 1
            if not added:
                raise RecordingError("an episode with no steps cannot be saved")
            dataset.save_episode()
        except Exception:
            dataset.clear_episode_buffer()
            self.close()
            self._num_episodes = self._read_num_episodes()
            raise
        index = dataset.meta.total_episodes - 1
        self._num_episodes = index + 1
        self._since_finalize += 1
        if finalize or (finalize is None and self._since_finalize >= self.finalize_every):
            self.close()
        return index

    def close(self) -> None:
        """Finalize what is open; until then the last ``finalize_every - 1`` episodes are not crash-safe."""
        dataset, self._dataset = self._dataset, None
        self._since_finalize = 0
        if dataset is not None:
            # Not reused if this fails (disk trouble): the next write re-opens the dataset, and the
            # next recorder on it (a restart) rolls back whatever this left torn.
            dataset.finalize()

    def __enter__(self) -> EpisodeRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -----------------------------------------------------------------

    def _open(self):
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        if self.use_videos:
            _quiet_encoder_logs()
        # Video frames go to the encoder as they are added, not through PNG files on disk first. Its
        # queue is unbounded (0): LeRobot drops a frame when a bounded one stays full for 0.1 s, and an
        # encoder thread starved that long on a loaded learner would leave the video shorter than the
        # episode. What it holds is bounded anyway: one episode's frames, already in memory here.
        video = ({"rgb_encoder": self.frames.rgb_encoder(), "streaming_encoding": True, "encoder_queue_maxsize": 0}
                 if self.use_videos else {})
        if (self.root / "meta" / "info.json").exists():
            return LeRobotDataset.resume(self.repo_id, root=self.root, **video)
        self.root.parent.mkdir(parents=True, exist_ok=True)
        return LeRobotDataset.create(
            self.repo_id,
            fps=self.fps,
            features=self.features,
            root=self.root,
            robot_type=self.robot_type,
            use_videos=self.use_videos,
            **video,
        )

    def _check_existing_layout(self) -> None:
        info = json.loads((self.root / "meta" / "info.json").read_text())
        stored = info.get("features", {})
        missing = sorted(k for k in self.features if k not in stored and k not in VERDICT_COLUMNS)
        if missing or int(info.get("fps", self.fps)) != self.fps:
            raise RecordingError(
                f"{self.root} holds a dataset with another layout (fps {info.get('fps')}, "
                f"missing columns {missing}); record into a new directory instead of mixing them"
            )

    def _frame(self, step: Step, instruction: str, seed: int) -> dict:
        dim = len(self.joint_names)
        state = _vector(step.state, dim, "state", step.tick)
        action = _vector(step.action, dim, "action", step.tick)
        policy_action = (action if step.policy_action is None
                         else _vector(step.policy_action, dim, "policy_action", step.tick))
        rolled = state if step.rolled_state is None else _vector(step.rolled_state, dim, "rolled_state", step.tick)
        frame: dict = {
            "observation.state": state,
            "action": action,
            "policy_action": policy_action,
            "rolled_state": rolled,
            "next.reward": np.array([step.reward], dtype=np.float32),
            "next.done": np.array([step.done], dtype=bool),
            "task": instruction or step.instruction or "",
        }
        for cam, (h, w) in self.cameras.items():
            image = step.images.get(cam)
            if image is None or image.shape != (h, w, 3) or image.dtype != np.uint8:
                got = None if image is None else (image.shape, image.dtype)
                raise RecordingError(f"step {step.tick}: camera '{cam}' image is {got}, expected ({h}, {w}, 3) uint8")
            frame[f"observation.images.{cam}"] = image
        values = {
            "next.success": step.success,
            "is_intervention": step.is_intervention,
            "policy_version": step.policy_version,
            "chunk_id": step.chunk_id,
            "chunk_index": step.chunk_index,
            "delay_ticks": step.delay_ticks,
            "stall": step.stall,
            "lateness_s": step.lateness_s,
            "episode_seed": seed,
            "next.success_source": source_code(step.success_source),
            "next.success_confidence": step.success_confidence,
        }
        for column, (dtype, _) in {**EXTRA_COLUMNS, **VERDICT_COLUMNS}.items():
            if column in self.features:
                frame[column] = np.array([values[column]], dtype=dtype)
        return frame


def _quiet_encoder_logs() -> None:
    """LeRobot hands libav's logging back to FFmpeg's own printer after each episode, which then
    prints the encoder's statistics (a dozen lines per camera and episode) into the operator's
    terminal; errors still print."""
    import av

    av.logging.set_libav_level(av.logging.ERROR)


def _stores_video(info_path: Path) -> bool:
    features = json.loads(info_path.read_text()).get("features", {})
    return any(ft.get("dtype") == "video" for ft in features.values())


def _vector(value: object, dim: int, name: str, tick: int) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float32)
    if arr.shape != (dim,):
        raise RecordingError(f"step {tick}: {name} has shape {arr.shape}, expected ({dim},)")
    if not np.isfinite(arr).all():
        raise RecordingError(f"step {tick}: {name} contains NaN/inf; the episode was not stored")
    return arr
