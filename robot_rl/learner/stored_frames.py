"""Frames of stored episodes read back by frame number: what the sampling index let go of.

Why by frame: a training batch needs one or two frames of each episode it samples (the observation
and the next chunk boundary's), so reading whole episodes back would decode ~hundreds of frames
for two. A video-stored camera (LeRobot's MP4, one file holding many episodes) is decoded at the
frames' timestamps by LeRobot's own (torchcodec) decoder; a PNG-stored one (inside the parquet) has the rows'
PNG bytes read and decoded. Frames come back at the policy's input size (``InputFrames``), the
size the index kept them at before it let them go: a lossless (PNG) frame read back equals the
one that was kept, bit for bit.

``FrameReader`` runs the reads on worker processes: decoding holds the interpreter, which the
trainer and the store's serving thread need. Frames that do not decode (a damaged PNG, a garbled
video) are ``UnreadableFramesError`` naming the episode and the file: the sampling index leaves that
episode out of training, where a bare decoder error would stop the trainer for good.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import multiprocessing
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robot_rl.core.errors import CorruptFileError
from robot_rl.data.reader import IMAGE_PREFIX
from robot_rl.policies.trainable import InputFrames


@dataclass(frozen=True)
class StoredEpisode:
    """Where an episode's frames are on disk: a LeRobotDataset v3 and the episode's index in it."""

    root: str
    repo_id: str
    episode_index: int


FrameRequest = Mapping[str, Sequence[int]]  # camera -> frame numbers within the episode
LEFT_OUT = "the episode is left out of training (the rest trains on); restore the file from a backup"


class UnreadableFramesError(RuntimeError):
    """Frames of ``episode`` that do not decode; ``cause`` names the file and what is wrong."""

    def __init__(self, episode: StoredEpisode, cause: CorruptFileError) -> None:
        self.episode = episode
        self.cause = cause
        super().__init__(f"episode {episode.episode_index} of {episode.root}: {cause}")

_METADATA: dict[tuple[str, str], Any] = {}  # per process: each dataset's metadata, reloaded when it grew
OPEN_VIDEO_FILES = 16  # per process: video files whose decoders stay open (LeRobot's files hold ~100s of MB)
_DECODERS: dict[str, tuple[tuple[int, int], Any]] = {}  # path -> (its size and mtime, a decoder cache)


def _metadata(episode: StoredEpisode) -> Any:
    # lerobot (optional extra): the dataset's own metadata reader
    from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata

    key = (episode.root, episode.repo_id)
    meta = _METADATA.get(key)
    if meta is None or meta.episodes is None or episode.episode_index >= len(meta.episodes):
        meta = _METADATA[key] = LeRobotDatasetMetadata(episode.repo_id, root=episode.root)
    if episode.episode_index >= len(meta.episodes):
        raise LookupError(f"dataset {episode.root} holds {len(meta.episodes)} episodes, not episode "
                          f"{episode.episode_index}")
    return meta


def read_stored_frames(episode: StoredEpisode, wanted: FrameRequest,
                       fits: Mapping[str, InputFrames]) -> dict[str, np.ndarray]:
    """uint8 [len(wanted[cam]),h,w,3] per camera: the episode's frames by number, fitted to ``fits``."""
    meta = _metadata(episode)
    row = meta.episodes[episode.episode_index]
    out = {}
    for cam, frames in wanted.items():
        key = f"{IMAGE_PREFIX}{cam}"
        numbers = [int(i) for i in frames]
        video = key in meta.video_keys
        path = Path(episode.root) / (meta.get_video_file_path(episode.episode_index, key) if video
                                     else meta.get_data_file_path(episode.episode_index))
        try:
            if video:
                images = _decode_video(path, meta, key, float(row[f"videos/{key}/from_timestamp"]), numbers)
            else:
                images = _decode_png_rows(path, key, int(row["dataset_from_index"]), numbers)
        except Exception as exc:  # PIL, Arrow, PyAV and torchcodec each report damage in classes of their own
            raise CorruptFileError(path, f"frames of episode {episode.episode_index} ({cam}) do not decode "
                                   f"({type(exc).__name__}: {exc})", LEFT_OUT) from exc
        fit = fits.get(cam)
        out[cam] = fit.apply(images) if fit is not None else images
    return out


def _decode_video(path: Path, meta: Any, key: str, start_s: float, numbers: list[int]) -> np.ndarray:
    """The frames by number, through LeRobot's torchcodec decoder: it seeks to each frame (pyav's decodes
    everything from the first frame asked to the last, hundreds of 640x480 frames for two). The decoder
    of a file stays open between reads until the file changes (the store rewrites the file it appends
    episodes to; the others never change)."""
    # lerobot (optional extra): the dataset's own video decoders
    from lerobot.datasets.video_utils import decode_video_frames, decode_video_frames_torchcodec

    unique = sorted(set(numbers))  # once each, in order
    tolerance_s = 0.5 / meta.fps
    stamps = [start_s + i / meta.fps for i in unique]
    if importlib.util.find_spec("torchcodec") is not None:
        decoded = decode_video_frames_torchcodec(path, stamps, tolerance_s, decoder_cache=_decoder_for(path),
                                                 return_uint8=True)
    else:  # one pyav seek per frame: its decoder runs from the first timestamp it is given to the last
        decoded = torch.cat([decode_video_frames(path, [t], tolerance_s, backend="pyav", return_uint8=True)
                             for t in stamps])
    frames = decoded.numpy().transpose(0, 2, 3, 1)
    where = {n: i for i, n in enumerate(unique)}
    return np.ascontiguousarray(frames[[where[n] for n in numbers]])


def _decoder_for(path: Path) -> Any:
    """A decoder cache holding ``path``'s open decoder while the file is unchanged (size and mtime)."""
    # lerobot (optional extra): its torchcodec decoder cache
    from lerobot.datasets.video_utils import VideoDecoderCache

    stat = path.stat()
    signature = (stat.st_mtime_ns, stat.st_size)
    known = _DECODERS.pop(str(path), None)
    if known is None or known[0] != signature:
        if known is not None:
            known[1].clear()
        known = (signature, VideoDecoderCache(max_size=1))
    _DECODERS[str(path)] = known  # most recently used last
    while len(_DECODERS) > OPEN_VIDEO_FILES:
        _DECODERS.pop(next(iter(_DECODERS)))[1].clear()
    return known[1]


def _decode_png_rows(path: Path, key: str, first_row: int, numbers: list[int]) -> np.ndarray:
    import pyarrow.compute as pc  # pyarrow: LeRobot's parquet dependency
    import pyarrow.parquet as pq
    from PIL import Image  # pillow: LeRobot's image dependency

    rows = [first_row + i for i in numbers]
    table = pq.read_table(path, columns=["index", key], filters=[("index", "in", sorted(set(rows)))])
    by_row = dict(zip(pc.cast(table["index"], "int64").to_pylist(), table[key].to_pylist(), strict=True))
    return np.stack([np.asarray(Image.open(io.BytesIO(by_row[r]["bytes"])).convert("RGB")) for r in rows])


class FrameReader:
    """Reads the frames of several stored episodes side by side on ``workers`` processes (0: in the
    calling thread). Workers are started by ``spawn``: the learner's process runs threads, which a
    forked child would inherit mid-lock."""

    def __init__(self, fits: Mapping[str, InputFrames], workers: int) -> None:
        if workers < 0:
            raise ValueError(f"FrameReader: workers must be >= 0, got {workers}")
        self.fits = dict(fits)
        self._pool = (ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
                      if workers > 0 else None)

    def read(self, requests: Mapping[StoredEpisode, FrameRequest]) -> dict[StoredEpisode, dict[str, np.ndarray]]:
        """Each episode's frames; ``UnreadableFramesError`` for the first whose frames do not decode."""
        if self._pool is None:
            return {episode: _result(episode, functools.partial(read_stored_frames, episode, wanted, self.fits))
                    for episode, wanted in requests.items()}
        futures = {episode: self._pool.submit(read_stored_frames, episode, wanted, self.fits)
                   for episode, wanted in requests.items()}
        return {episode: _result(episode, future.result) for episode, future in futures.items()}

    def worker_pids(self) -> list[int]:
        """The worker processes' ids (their memory is the learner's too: ``robot-rl bench soak``)."""
        return [] if self._pool is None else [p.pid for p in getattr(self._pool, "_processes", {}).values()
                                              if p.pid is not None]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def _result(episode: StoredEpisode, read: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    try:
        return read()
    except CorruptFileError as exc:
        raise UnreadableFramesError(episode, exc) from exc
