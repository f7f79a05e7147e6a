"""Demonstrations with the sim in a child process: the same dataset as a serial recording,
frame for frame; a child that fails reports why and leaves what was written finalized."""

import numpy as np
import pytest

from robot_rl.app.demo_process import DemoJob, DemoProcessError, record_demos_in_child
from robot_rl.app.record_demos import record_demos
from robot_rl.config import ConfigError, load_config
from robot_rl.data import load_episode_arrays

EPISODES = 2


def _config(directory, *overrides):
    return load_config([f"demos.dir={directory}", f"demos.episodes={EPISODES}", "demos.expert_speed=1.0",
                        *overrides])


def test_child_recording_equals_the_serial_one_dart_noise_included(tmp_path):
    serial = record_demos(_config(tmp_path / "serial", "demos.sim_process=false", "demos.noise_deg=2"), progress=False)
    child = record_demos(_config(tmp_path / "child", "demos.noise_deg=2"), progress=False)
    assert child == serial and serial.stored == EPISODES
    ours, theirs = load_episode_arrays(tmp_path / "child"), load_episode_arrays(tmp_path / "serial")
    assert len(ours) == len(theirs) == EPISODES
    for a, b in zip(ours, theirs, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(a[key], np.ndarray):
                np.testing.assert_array_equal(a[key], b[key], err_msg=key)  # images too: raw on the pipe
            else:
                assert a[key] == b[key], key
    assert sorted(int(e["episode_seed"][0]) for e in ours) == list(range(EPISODES))


def test_a_failing_child_reports_its_error_and_keeps_what_was_written(tmp_path):
    cfg = load_config([])
    # The second family does not exist: the child fails on its first attempt there, after one push episode.
    job = DemoJob(cfg.robot, 1.0, ("push", "no_such_family"), 1, cfg.seeds.demos, cfg.seeds.stride)
    with pytest.raises(DemoProcessError, match="no_such_family"):
        record_demos_in_child(job, tmp_path / "demos", progress=False)
    kept = load_episode_arrays(tmp_path / "demos")
    assert len(kept) == 1 and len(kept[0]["action"]) > 0


@pytest.mark.parametrize("override, message", [
    ("demos.sim_process=maybe", "demos.sim_process"),
    ("demos.expert_speed=1.5", "demos.expert_speed must be in"),
    ("task_families=[push,juggle]", "juggle"),
])
def test_bad_settings_are_refused_before_anything_starts(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        record_demos(_config(tmp_path / "demos", override), progress=False)
    assert not (tmp_path / "demos").exists()


def test_episodes_too_short_for_the_expert_store_nothing_and_say_so_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"solved none of its 3 attempts within robot.max_episode_steps=5"):
        record_demos(_config(tmp_path / "demos", "demos.episodes=1", "robot.max_episode_steps=5",
                             "demos.sim_process=false"), progress=False)
