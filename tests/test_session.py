"""`robot-rl session`: end to end in the sim through the real CLI in a subprocess (the scripted
operator takes over from a policy that is stuck, episodes are recorded as a LeRobotDataset v3,
a scripted e-stop ends the session with exit code 3 after saving what was recorded); in-process,
its settings, its refusals, and streaming to a learner set by ``link.learner``."""

from __future__ import annotations

import os
import re
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
        "robot=sim_so101", "policy=hold", "teleop=scripted", "teleop.stuck_ticks=20",
        "session.episodes=3", "session.max_episode_steps=90", "session.realtime=false", "session.seed=40",
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
    first_success = np.asarray(first["next.success"]).reshape(-1)
    assert len(first["action"]) == 90 or first_success[-1]  # ran out of time, or the operator's push succeeded
    # The sim's scenes are recorded with the seeds that set them up (session.seed, then one more each).
    assert [int(np.asarray(e["episode_seed"]).reshape(-1)[0]) for e in episodes] == [40, 41]
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


def test_a_real_robot_runs_only_a_named_checkpoint():
    """The sim jobs fall back to the BC or the shipped checkpoint; a real arm never does."""
    from robot_rl.config import ConfigError, load_config
    from robot_rl.session.runner import check_policy_choice

    with pytest.raises(ConfigError, match="policy=hold"):
        check_policy_choice(load_config(["robot=so101"]))
    check_policy_choice(load_config(["robot=so101", "policy.path=outputs/bc_policy"]))
    check_policy_choice(load_config(["robot=so101", "policy=hold"]))
    check_policy_choice(load_config(["robot=sim_so101"]))


def test_session_settings_are_typed_and_composed_with_the_link(tmp_path):
    from robot_rl.config import load_config
    from robot_rl.hardware.teleop.scripted import ScriptedOperatorConfig

    cfg = load_config(["teleop=scripted", "teleop.stuck_ticks=20", "link.learner=tcp://127.0.0.1:5555",
                       f"output_dir={tmp_path}"])
    assert isinstance(cfg.teleop, ScriptedOperatorConfig) and cfg.teleop.stuck_ticks == 20
    assert load_config(["teleop=scripted", "teleop.max_step_per_tick=6"]).teleop.max_step_per_tick == 6.0
    assert cfg.session.dataset_root == f"{tmp_path}/session"
    assert cfg.link.client_config("sim_so101", cfg.output_dir).pub_endpoint == "tcp://127.0.0.1:5556"


def test_a_misspelled_session_setting_is_one_line_naming_the_right_one(capsys):
    from robot_rl.cli import main

    assert main(["session", "session.episdes=3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "session.episdes is not a setting" in err, err
    assert re.search(r"did you mean session\.episodes\?", err) and "'session' has episodes" in err, err


@pytest.mark.parametrize("command", ["session", "calibrate"])
def test_session_and_calibrate_answer_help(command, capsys):
    import importlib

    from robot_rl.cli import main

    assert main([command, "--help"]) == 0
    assert main([command, "-h"]) == 0
    module = importlib.import_module(f"robot_rl.commands.{command}")
    assert "examples:" in module.HELP and "robot" in module.GROUPS
    assert "robot-rl " + command in capsys.readouterr().out


def test_a_session_with_link_learner_streams_its_episodes_to_that_learner(tmp_path, monkeypatch):
    """In-process: the sim, a tiny flow policy, and a learner on loopback that stores what the
    session streams (the policy's config hash admits it); the session also records locally. A
    rerecorded attempt reaches the learner as a truncated episode and stays out of the local dataset."""
    from robot_rl.commands import session
    from robot_rl.learner.service import LearnerService
    from robot_rl.policies.flow_vla import FlowVLA
    from tests.learner_helpers import learner_config, store_config, tiny_sim_weights, wait_for

    weights, _ = tiny_sim_weights(tmp_path / "policy", monkeypatch)
    config = learner_config(tmp_path / "learner")
    config.store = store_config(tmp_path / "learner" / "store", background_commit=True, cameras=("front", "wrist"),
                                image_height=32, image_width=32,
                                joint_names=("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex",
                                             "wrist_roll", "gripper"))
    learner = LearnerService(config, FlowVLA.from_pretrained(weights), train=False).start()
    try:
        code = session.main([
            "robot=sim_so101", f"policy.path={weights}", "teleop=none", f"output_dir={tmp_path / 'out'}",
            "session.episodes=1", "session.max_episode_steps=12", "session.realtime=false", "session.keys=script",
            "session.key_script=[0:5:r]", "session.ask_outcome=false", "robot.image_height=32",
            "robot.image_width=32", f"link.learner={learner.router_endpoint}", f"link.weights={learner.pub_endpoint}",
        ])
        assert code == 0
        wait_for(lambda: learner.store.stats()["episodes_stored"] == 2, timeout_s=60, what="both episodes stored")
        assert learner.store.flush(60)
    finally:
        learner.stop(checkpoint=False)
    assert "sim_so101" in learner.robots  # streamed as the robot's name (link.robot_id unset)
    from robot_rl.data import load_episode_arrays

    stored = load_episode_arrays(tmp_path / "learner" / "store" / "dataset", "local/robot_rl_replay")
    ends = sorted((len(e["action"]), bool(np.asarray(e["next.done"]).reshape(-1)[-1])) for e in stored)
    assert ends == [(6, False), (12, True)]  # the thrown-away attempt (ticks 0..5) truncated; the kept one done
    assert [len(e["action"]) for e in load_episode_arrays(tmp_path / "out" / "session",
                                                          repo_id="local/robot_rl_session")] == [12]


def test_a_session_without_keys_shows_no_key_help(tmp_path, capsys):
    from robot_rl.cli import main

    assert main(["session", "robot=sim_so101", "policy=hold", "teleop=none", f"output_dir={tmp_path}",
                 "session.episodes=1", "session.max_episode_steps=3", "session.realtime=false", "session.keys=none",
                 "robot.image_height=32", "robot.image_width=32", "robot.cameras=[front]"]) == 0
    out = capsys.readouterr()
    assert "session over" in out.err and "take over" not in out.out + out.err


def test_sim_scenes_rotate_the_task_families_and_a_rerecord_gets_the_same_scene_again():
    from robot_rl.session.scenes import SceneDraw

    draw = SceneDraw(100, ["push", "pick"])
    first, again, second, third = draw.next(), draw.next(same=True), draw.next(), draw.next()
    assert (first.seed, first.family) == (100, "push") and again == first
    assert (second.seed, second.family, third.seed, third.family) == (101, "pick", 102, "push")
    assert SceneDraw(None).next().seed is None  # a real robot's scene has no seed
    assert SceneDraw.for_sim(None, None).next().seed != 0  # sessions do not all start at seed 0


def scripted_sim_session(out, steps: int, keys: str) -> int:
    """Two episodes of ``steps`` ticks of a hold policy in the sim from scene 7, the operator's keys scripted."""
    from robot_rl.cli import main

    return main(["session", "robot=sim_so101", "policy=hold", "teleop=none", f"output_dir={out}",
                 "session.episodes=2", f"session.max_episode_steps={steps}", "session.realtime=false",
                 "session.seed=7", "session.keys=script", f"session.key_script=[{keys}]", "robot.image_height=32",
                 "robot.image_width=32", "robot.cameras=[front]"])


def test_r_rerecords_the_episode_in_the_same_scene_and_nothing_of_it_is_kept(tmp_path):
    import json

    out = tmp_path / "out"
    assert scripted_sim_session(out, steps=20, keys="0:5:r") == 0
    log = [json.loads(line) for line in (out / "session_log.jsonl").read_text().splitlines()]
    assert [e["verdict"] for e in log] == ["rerecord", "failure", "failure"]
    assert [e["scene_seed"] for e in log] == [7, 7, 8]  # the rerecord repeats scene 7
    assert [e["dataset_index"] for e in log] == [None, 0, 1]
    from robot_rl.data import load_episode_arrays

    episodes = load_episode_arrays(out / "session", repo_id="local/robot_rl_session")
    assert [len(e["action"]) for e in episodes] == [20, 20]  # the 6-step attempt is not in the dataset


def test_each_recorded_verdict_says_who_gave_it(tmp_path):
    """The operator's key is the operator's verdict; time running out in the sim leaves it to the task."""
    from robot_rl.core.types import SUCCESS_SOURCES
    from robot_rl.data import load_episode_arrays

    out = tmp_path / "out"
    assert scripted_sim_session(out, steps=12, keys="0:5:s") == 0
    episodes = load_episode_arrays(out / "session", repo_id="local/robot_rl_session")
    said = [(bool(e["next.success"][-1]), SUCCESS_SOURCES[int(e["next.success_source"][-1])],
             float(e["next.success_confidence"][-1])) for e in episodes]
    assert said == [(True, "operator", 1.0), (False, "task", 1.0)]  # a hold policy pushes nothing in 12 ticks


def test_warm_up_runs_one_inference_on_the_real_observation_and_moves_nothing():
    from robot_rl.session.runner import warm_up
    from tests.edge_fakes import EncodingPolicy, KinematicRobot

    robot, policy = KinematicRobot(start=5.0), EncodingPolicy()
    warm_up(policy, robot, "push the cube")
    assert policy.calls == 1 and np.allclose(policy.states[0], 5.0) and policy.instructions == ["push the cube"]
    assert robot.sent == []  # the arm was not commanded
