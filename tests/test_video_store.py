"""Camera frames stored with LeRobot's video encoding: what is written is what training reads, frame
for frame and episode for episode, and a writer killed mid-batch loses nothing already stored."""

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from robot_rl.core.types import Episode, Step
from robot_rl.data import EpisodeRecorder, load_episode_arrays
from robot_rl.data.frame_storage import FrameStorageConfig

JOINTS = ("a", "b", "c")
CAMS = {"front": (48, 64), "wrist": (32, 32)}
VIDEO = FrameStorageConfig(images="video")
# Lossy, but far from the 40 levels between two episodes' colours or a square's 200 of contrast.
MAX_MEAN_ERROR = 6.0


def camera_frame(shape: tuple[int, int], episode_id: int, tick: int, camera: int) -> np.ndarray:
    """A flat colour that says which episode (and camera) it is from, and a bright square whose
    column says which tick: a frame read from the wrong episode or shifted in time does not match."""
    h, w = shape
    frame = np.full((h, w, 3), 30 + 40 * (episode_id % 5) + 10 * camera, np.uint8)
    x = (4 * tick) % (w - 8)
    frame[h // 2 - 4:h // 2 + 4, x:x + 8] = 250
    return frame


def video_episode(episode_id: int, length: int) -> Episode:
    steps = [Step(tick=t, time_s=t / 30, state=np.full(3, t, np.float32), action=np.full(3, -t, np.float32),
                  images={cam: camera_frame(shape, episode_id, t, c) for c, (cam, shape) in enumerate(CAMS.items())},
                  done=t == length - 1)
             for t in range(length)]
    return Episode(robot_id="r0", episode_id=episode_id, instruction=f"task {episode_id}", steps=steps)


def assert_frames_match(stored: dict, episode: Episode) -> None:
    assert len(stored["state"]) == len(episode.steps)
    for cam in CAMS:
        written = np.stack([s.images[cam] for s in episode.steps]).astype(np.float32)
        read = stored[f"images.{cam}"]
        assert read.shape == written.shape and read.dtype == np.uint8
        per_frame = np.abs(read.astype(np.float32) - written).mean(axis=(1, 2, 3))
        assert per_frame.max() < MAX_MEAN_ERROR, (episode.episode_id, cam, per_frame.round(1).tolist())


def test_video_frames_read_back_per_episode_and_tick(tmp_path):
    root = tmp_path / "ds"
    episodes = [video_episode(0, 20), video_episode(1, 13), video_episode(2, 17)]
    with EpisodeRecorder(root, fps=30, joint_names=JOINTS, cameras=CAMS, frames=VIDEO, finalize_every=2) as rec:
        assert [rec.write_episode(ep) for ep in episodes] == [0, 1, 2]
    info = json.loads((root / "meta" / "info.json").read_text())
    assert {info["features"][f"observation.images.{cam}"]["dtype"] for cam in CAMS} == {"video"}
    assert list(root.glob("videos/observation.images.front/chunk-*/file-*.mp4"))
    assert not list(root.glob("data/**/*.png"))
    loaded = load_episode_arrays(root)
    for stored, episode in zip(loaded, episodes, strict=True):
        assert_frames_match(stored, episode)
        np.testing.assert_array_equal(stored["state"][:, 0], np.arange(len(episode.steps)))
    # Only some episodes, as the learner's index reads a store's tail.
    [middle] = load_episode_arrays(root, episodes=[1])
    assert_frames_match(middle, episodes[1])


def test_an_encoder_that_stalls_loses_no_frame(tmp_path, monkeypatch):
    """LeRobot's streaming encoder drops a frame (a warning, nothing more) when its queue stays full
    for 0.1 s: an encoder thread starved that long on a loaded learner (a trainer and four robots'
    ingest on a few cores) would leave the video shorter than the episode's rows."""
    from lerobot.datasets import video_utils

    real = video_utils.Image.fromarray
    stalled: list[bool] = []

    def stall_once(*args, **kwargs):  # the encoder thread's first frame: descheduled for 0.4 s
        if not stalled:
            stalled.append(True)
            time.sleep(0.4)
        return real(*args, **kwargs)

    monkeypatch.setattr(video_utils.Image, "fromarray", stall_once)
    episode = video_episode(0, 70)  # more frames than LeRobot's default queue of 30 holds
    with EpisodeRecorder(tmp_path / "ds", fps=30, joint_names=JOINTS, cameras=CAMS, frames=VIDEO) as rec:
        rec.write_episode(episode)
    assert stalled
    [stored] = load_episode_arrays(tmp_path / "ds")
    assert_frames_match(stored, episode)


def test_auto_stores_camera_size_frames_as_video_and_small_ones_as_png(tmp_path):
    auto = FrameStorageConfig()
    assert auto.use_videos({"front": (480, 640)}) and not auto.use_videos({"front": (96, 96), "wrist": (96, 96)})
    small = EpisodeRecorder(tmp_path / "small", fps=30, joint_names=JOINTS, cameras={"front": (8, 8)})
    assert small.features["observation.images.front"]["dtype"] == "image"
    with pytest.raises(ValueError, match="frames.images"):
        FrameStorageConfig(images="jpeg")


def test_an_existing_dataset_keeps_its_image_layout(tmp_path):
    root = tmp_path / "ds"
    with EpisodeRecorder(root, fps=30, joint_names=JOINTS, cameras=CAMS, frames=VIDEO) as rec:
        rec.write_episode(video_episode(0, 6))
    png_config = FrameStorageConfig(images="png")
    with EpisodeRecorder(root, fps=30, joint_names=JOINTS, cameras=CAMS, frames=png_config) as rec:
        assert rec.use_videos
        rec.write_episode(video_episode(1, 7))
    for stored, episode in zip(load_episode_arrays(root), [video_episode(0, 6), video_episode(1, 7)], strict=True):
        assert_frames_match(stored, episode)


KILLED_VIDEO_WRITER = """
import os, sys
sys.path.insert(0, {repo!r})
from tests.test_video_store import CAMS, JOINTS, VIDEO, video_episode
from robot_rl.data import EpisodeRecorder
recorder = EpisodeRecorder({root!r}, fps=30, joint_names=JOINTS, cameras=CAMS, frames=VIDEO)
recorder.write_episode(video_episode(2, 9), finalize=False)
recorder.write_episode(video_episode(3, 11), finalize=False)
os._exit(3)  # killed before finalize: the two episodes' videos are on disk, their metadata is not
"""


def test_a_video_writer_killed_before_finalize_keeps_earlier_episodes_and_sets_its_videos_aside(tmp_path):
    root = tmp_path / "ds"
    kept = [video_episode(0, 12), video_episode(1, 8)]
    with EpisodeRecorder(root, fps=30, joint_names=JOINTS, cameras=CAMS, frames=VIDEO) as rec:
        for episode in kept:
            rec.write_episode(episode)
    videos_before = set(root.glob("videos/*/chunk-*/file-*.mp4"))
    repo = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-c", KILLED_VIDEO_WRITER.format(repo=repo, root=str(root))],
                          cwd=repo, capture_output=True, text=True, timeout=180)
    assert done.returncode == 3, done.stderr[-2000:]
    torn_videos = set(root.glob("videos/*/chunk-*/file-*.mp4")) - videos_before
    assert torn_videos, "the killed writer's episodes reached video files"

    reopened = EpisodeRecorder(root, fps=30, joint_names=JOINTS, cameras=CAMS, frames=VIDEO)
    assert reopened.num_episodes == 2
    # The torn videos are kept aside (the next write would otherwise reuse their file names), not deleted.
    aside = {p.relative_to(next((tmp_path / "ds.interrupted").iterdir())).as_posix()
             for p in (tmp_path / "ds.interrupted").rglob("*.mp4")}
    assert aside == {p.relative_to(root).as_posix() for p in torn_videos}
    after = video_episode(4, 10)
    assert reopened.write_episode(after, finalize=True) == 2
    for stored, episode in zip(load_episode_arrays(root), kept + [after], strict=True):
        assert_frames_match(stored, episode)


@pytest.mark.slow
def test_the_learner_store_writes_video_in_its_writer_process_and_reads_it_back_after_a_restart(tmp_path):
    from robot_rl.learner.store import ReplayStore
    from tests.learner_helpers import IMG, make_steps, store_config
    from tests.test_learner_store import segments

    config = store_config(tmp_path, writer="process", frames=VIDEO)
    with ReplayStore(config) as store:
        for episode in (1, 2):
            for segment in segments("r0", episode, make_steps(10, robot=0, episode=episode)):
                store.ingest(segment)
        assert store.flush(timeout_s=120) and store.stats()["episodes_stored"] == 2
    info = json.loads((tmp_path / "dataset" / "meta" / "info.json").read_text())
    assert info["features"]["observation.images.front"]["dtype"] == "video"
    with ReplayStore(config) as reopened:  # a restart reads the sampling index back from the videos
        assert reopened.index.wait_loaded(timeout_s=120)
        assert reopened.index.counts()["online"] == 20
    for stored in load_episode_arrays(tmp_path / "dataset", "local/robot_rl_replay"):
        written = np.stack([np.full((IMG, IMG, 3), (t * 7) % 256, np.uint8) for t in range(10)]).astype(np.float32)
        assert np.abs(stored["images.front"].astype(np.float32) - written).mean(axis=(1, 2, 3)).max() < MAX_MEAN_ERROR
