"""`robot-rl session` end to end in the sim, through the real CLI in a subprocess: the scripted
operator takes over from a policy that is stuck, episodes are recorded (LeRobotDataset v3),
and a scripted e-stop ends the session with exit code 3 after saving what was recorded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from robot_rl.hardware.teleop.keys import TerminalKeys

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_scripted_operator_session_in_sim_with_estop_writes_a_dataset(tmp_path):
    root = tmp_path / "session"
    cmd = [
        sys.executable, "-m", "robot_rl.cli", "session",
        "robot=sim_so101", "policy.type=hold", "teleop=scripted",
        "session.episodes=3", "session.max_episode_steps=90", "session.realtime=false",
        f"session.dataset_root={root}", "session.keys=script", "session.key_script=[1:30:e]",
        "robot.image_height=32", "robot.image_width=32", "robot.cameras=[front]",
    ]
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", MUJOCO_GL="egl")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=400, stdin=subprocess.DEVNULL)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out[-3000:]
    assert "keys: [space] take over" in out  # bindings shown
    assert "E-STOP" in out
    assert "INTERVENING" in out or "operator takes over" in out

    from robot_rl.data import load_episode_arrays

    episodes = load_episode_arrays(root, repo_id="local/robot_rl_session")
    assert len(episodes) == 2  # episode 3 never started
    first, second = episodes
    assert len(first["action"]) == 90
    flags = np.asarray(first["is_intervention"]).reshape(-1).astype(bool)
    assert flags.any() and not flags[:20].any()  # the operator took over, after its grace period
    assert len(second["action"]) == 31  # e-stopped at tick 30: ticks 0..30 recorded
    assert not np.asarray(second["next.success"]).reshape(-1).any()
    assert first["images.front"].shape[1:] == (32, 32, 3)


def test_terminal_keys_read_single_keys_without_enter():
    master, slave = os.openpty()
    with os.fdopen(slave, "r") as stream:
        keys = TerminalKeys(stream)
        try:
            os.write(master, b"s e")
            got = []
            for _ in range(50):  # bounded: the bytes are already in the pty buffer
                got += keys.poll(0, 0)
                if len(got) >= 3:
                    break
            assert got == ["s", "space", "e"]
            assert keys.poll(0, 1) == []
        finally:
            keys.close()
    os.close(master)


def test_session_without_a_policy_path_says_what_to_do(tmp_path):
    from robot_rl.commands.session import compose
    from robot_rl.config import ConfigError
    from robot_rl.session import factory

    cfg = compose(["robot=sim_so101", "policy.path=null"])
    with pytest.raises(ConfigError, match="policy.type=hold"):
        factory.make_policy(cfg, 6)


def test_learner_url_is_taken_out_of_the_hydra_overrides():
    from robot_rl.commands.session import split_learner

    learner, rest = split_learner(["robot=so101", "learner=tcp://127.0.0.1:5555", "policy.path=x"])
    assert learner == "tcp://127.0.0.1:5555" and rest == ["robot=so101", "policy.path=x"]
