"""The recorder writes LeRobotDataset v3 episodes that LeRobot and our reader read back exactly."""

import json
import logging

import numpy as np
import pytest

from robot_rl.core.types import Episode, Step
from robot_rl.data import EpisodeRecorder, load_episode_arrays
from robot_rl.data.recorder import RecordingError

JOINTS = ("a", "b", "c")
CAMS = {"front": (8, 8)}


def make_episode(episode_id: int, length: int, seed: int) -> Episode:
    rng = np.random.default_rng(seed)
    steps = []
    for t in range(length):
        steps.append(
            Step(
                tick=t,
                time_s=t / 30,
                state=rng.normal(size=3).astype(np.float32),
                action=rng.normal(size=3).astype(np.float32),
                images={"front": rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)},
                policy_version=7,
                chunk_id=t // 4,
                chunk_index=t % 4,
                delay_ticks=2,
                is_intervention=t in (3, 4),
                reward=float(t == length - 1),
                done=t == length - 1,
                success=t == length - 1,
            )
        )
    return Episode(robot_id="r0", episode_id=episode_id, instruction=f"task {episode_id}", steps=steps)


def test_round_trip_two_episodes(tmp_path):
    recorder = EpisodeRecorder(tmp_path / "ds", fps=30, joint_names=JOINTS, cameras=CAMS)
    episodes = [make_episode(0, 6, 1), make_episode(1, 5, 2)]
    assert [recorder.write_episode(ep) for ep in episodes] == [0, 1]
    loaded = load_episode_arrays(tmp_path / "ds")
    assert len(loaded) == 2
    for ep, arrays in zip(episodes, loaded, strict=True):
        np.testing.assert_array_equal(arrays["state"], np.stack([s.state for s in ep.steps]))
        np.testing.assert_array_equal(arrays["action"], np.stack([s.action for s in ep.steps]))
        np.testing.assert_array_equal(arrays["images.front"], np.stack([s.images["front"] for s in ep.steps]))
        assert arrays["instruction"] == ep.instruction
        assert arrays["is_intervention"].reshape(-1).tolist() == [s.is_intervention for s in ep.steps]
        assert arrays["chunk_index"].reshape(-1).tolist() == [s.chunk_index for s in ep.steps]
    info = json.loads((tmp_path / "ds" / "meta" / "info.json").read_text())
    assert info["codebase_version"].startswith("v3")


def test_bad_episode_is_refused_and_stored_data_survives(tmp_path):
    recorder = EpisodeRecorder(tmp_path / "ds", fps=30, joint_names=JOINTS, cameras=CAMS)
    recorder.write_episode(make_episode(0, 4, 1))
    bad = make_episode(1, 4, 2)
    bad.steps[2].action = np.array([0.0, np.nan, 0.0], dtype=np.float32)
    with pytest.raises(RecordingError, match="NaN"):
        recorder.write_episode(bad)
    wrong_image = make_episode(2, 4, 3)
    wrong_image.steps[0].images["front"] = np.zeros((4, 4, 3), np.uint8)
    with pytest.raises(RecordingError, match="camera 'front'"):
        recorder.write_episode(wrong_image)
    # A fresh recorder (as after a restart) still sees exactly the first episode and can append.
    reopened = EpisodeRecorder(tmp_path / "ds", fps=30, joint_names=JOINTS, cameras=CAMS)
    assert reopened.num_episodes == 1
    reopened.write_episode(make_episode(3, 3, 4))
    assert [len(e["state"]) for e in load_episode_arrays(tmp_path / "ds")] == [4, 3]


def test_mismatched_layout_is_refused(tmp_path):
    EpisodeRecorder(tmp_path / "ds", fps=30, joint_names=JOINTS, cameras=CAMS).write_episode(make_episode(0, 3, 1))
    with pytest.raises(RecordingError, match="another layout"):
        EpisodeRecorder(tmp_path / "ds", fps=15, joint_names=JOINTS, cameras=CAMS)


def test_batched_finalize_keeps_every_episode(tmp_path):
    with EpisodeRecorder(tmp_path / "ds", fps=30, joint_names=JOINTS, cameras=CAMS, finalize_every=3) as recorder:
        indices = [recorder.write_episode(make_episode(i, 3 + i, i)) for i in range(4)]
    assert indices == [0, 1, 2, 3]
    assert [len(e["state"]) for e in load_episode_arrays(tmp_path / "ds")] == [3, 4, 5, 6]


KILLED_WRITER = """
import os, sys
sys.path.insert(0, {repo!r})
from tests.test_data_recorder import CAMS, JOINTS, make_episode
from robot_rl.data import EpisodeRecorder
recorder = EpisodeRecorder({root!r}, fps=30, joint_names=JOINTS, cameras=CAMS)
recorder.write_episode(make_episode(2, 4, 3), finalize=False)
recorder.write_episode(make_episode(3, 5, 4), finalize=False)
os._exit(3)  # killed before finalize: info.json already counts both episodes
"""


def test_a_writer_killed_before_finalize_is_rolled_back_and_earlier_episodes_stay_readable(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = tmp_path / "ds"
    with EpisodeRecorder(root, fps=30, joint_names=JOINTS, cameras=CAMS) as recorder:
        recorder.write_episode(make_episode(0, 6, 1))
        recorder.write_episode(make_episode(1, 3, 2))
    repo = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-c", KILLED_WRITER.format(repo=repo, root=str(root))],
                          cwd=repo, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr[-2000:]
    assert json.loads((root / "meta" / "info.json").read_text())["total_episodes"] == 4  # the torn state

    reopened = EpisodeRecorder(root, fps=30, joint_names=JOINTS, cameras=CAMS)
    assert reopened.num_episodes == 2
    moved = list((tmp_path / "ds.interrupted").rglob("*.parquet"))
    assert moved, "the torn files are kept aside, not deleted"
    assert reopened.write_episode(make_episode(4, 7, 5)) == 2
    assert [len(e["state"]) for e in load_episode_arrays(root)] == [6, 3, 7]


def test_damage_that_a_killed_writer_cannot_explain_is_reported_and_left_alone(tmp_path):
    from robot_rl.data.repair import DatasetRepairError

    root = tmp_path / "ds"
    with EpisodeRecorder(root, fps=30, joint_names=JOINTS, cameras=CAMS) as recorder:
        recorder.write_episode(make_episode(0, 4, 1))
        recorder.write_episode(make_episode(1, 3, 2))
    first = sorted((root / "data").rglob("*.parquet"))[0]
    first.write_bytes(first.read_bytes()[:100])  # an old, finalized file damaged afterwards
    info_before = (root / "meta" / "info.json").read_text()
    with pytest.raises(DatasetRepairError, match="later episodes"):
        EpisodeRecorder(root, fps=30, joint_names=JOINTS, cameras=CAMS)
    assert (root / "meta" / "info.json").read_text() == info_before
    assert not (tmp_path / "ds.interrupted").exists()


def test_writing_png_episodes_logs_no_video_codec_lines(tmp_path, caplog):
    """Demonstrations and every robot's own dataset write through this recorder: LeRobot's "Using
    video codec" INFO lines, two per open, said nothing about a PNG dataset and filled the run's log."""
    with caplog.at_level(logging.INFO):
        recorder = EpisodeRecorder(tmp_path / "ds", fps=30, joint_names=JOINTS, cameras=CAMS)
        recorder.write_episode(make_episode(0, 4, 1))
        recorder.write_episode(make_episode(1, 4, 2))
    assert recorder.num_episodes == 2
    assert "Using video codec" not in caplog.text


def test_a_dataset_recorded_before_verdict_sources_is_appended_to_without_them(tmp_path, monkeypatch):
    from robot_rl.data import recorder as recorder_module
    from robot_rl.data.features import VERDICT_COLUMNS

    full = recorder_module.dataset_features
    monkeypatch.setattr(recorder_module, "dataset_features",
                        lambda *a, **k: {n: f for n, f in full(*a, **k).items() if n not in VERDICT_COLUMNS})
    with EpisodeRecorder(tmp_path / "ds", fps=30, joint_names=JOINTS, cameras=CAMS) as old:
        old.write_episode(make_episode(0, 5, seed=1))
    monkeypatch.undo()
    with EpisodeRecorder(tmp_path / "ds", fps=30, joint_names=JOINTS, cameras=CAMS) as recorder:
        assert recorder.write_episode(make_episode(1, 4, seed=2)) == 1
    episodes = load_episode_arrays(tmp_path / "ds")
    assert [len(e["action"]) for e in episodes] == [5, 4] and "next.success_source" not in episodes[1]
    with EpisodeRecorder(tmp_path / "new", fps=30, joint_names=JOINTS, cameras=CAMS) as fresh:
        fresh.write_episode(make_episode(0, 3, seed=1))
    assert "next.success_confidence" in load_episode_arrays(tmp_path / "new")[0]
