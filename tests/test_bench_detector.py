"""`robot-rl bench detector`: its settings, the sim episodes it records (labelled by the ground truth,
frames thinned), and its ROC-AUC."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from robot_rl.app.config import VerdictMode
from robot_rl.bench.detector import Attempt, record_episode, roc_auc
from robot_rl.bench.detector_main_job import arm_configs
from robot_rl.config import ConfigError, load_config


def test_bench_settings_are_typed_and_the_detector_is_the_learners():
    cfg = load_config(["+bench=detector", "bench.labelled=[10,20]", "learner.detector.epochs=5"])
    assert cfg.bench.labelled == [10, 20] and cfg.bench.test_episodes == 60
    assert cfg.learner.detector.epochs == 5
    assert load_config(["+bench=detector_quick"]).bench.labelled == [8, 16]


@pytest.mark.parametrize("override, message", [
    ("bench.labelled=[2]", "counts >= 4"),
    ("bench.failure_share=1.0", "failure_share must be in"),
    ("bench.stop_ticks=[50,10]", "stop_ticks must be"),
])
def test_bad_settings_are_refused_before_anything_runs(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(["+bench=detector", override])


def test_the_expert_succeeds_a_stopped_expert_fails_and_frames_are_thinned_but_end_at_the_last_tick():
    from robot_rl.hardware.sim import ScriptedExpert, SimConfig, SimSO101

    cfg = load_config(["+bench=detector", "bench.frame_stride=10"])
    robot = SimSO101(SimConfig(cameras=("front",)))
    robot.connect()
    expert = ScriptedExpert(robot)
    try:
        done = record_episode(robot, expert, 7, "push", Attempt("expert"), cfg.bench, verdict_frames=3)
        stopped = record_episode(robot, expert, 7, "push", Attempt("stopped", stop_tick=5), cfg.bench, verdict_frames=3)
    finally:
        robot.disconnect()
    assert done.success and not stopped.success
    # the stopped expert ran ticks 0..21 (5 own commands, then holding): kept 0, 10, 20 and the last three
    assert len(stopped.frames["front"]) == 5
    assert not np.array_equal(stopped.frames["front"][0], done.frames["front"][-1])  # the cube moved


def test_roc_auc_is_the_chance_a_success_scores_above_a_failure():
    outcomes = np.array([True, True, False, False])
    assert roc_auc(np.array([0.9, 0.8, 0.1, 0.2]), outcomes) == 1.0
    assert roc_auc(np.array([0.9, 0.1, 0.5, 0.2]), outcomes) == 0.5
    assert roc_auc(np.array([0.5, 0.5, 0.5, 0.5]), outcomes) == 0.5
    assert np.isnan(roc_auc(np.array([0.9]), np.array([True])))


def test_the_main_job_arms_differ_only_in_who_judges_and_a_bad_learner_fails_before_anything_runs(tmp_path):
    base = ["+bench=detector", "bench.main_job=true", "seed=3"]

    def compose(more: list[str]):
        return load_config([*base, *more])

    bench = compose([]).bench
    configs = arm_configs(compose, bench, tmp_path)
    oracle, detector = configs["oracle"], configs["detector"]
    assert (oracle.run.verdicts, detector.run.verdicts) == (VerdictMode.task, VerdictMode.detector)
    assert oracle.learner.name == detector.learner.name == "rwr"  # a learner that weighs outcomes
    assert oracle.seed == detector.seed == 3 and oracle.run.time_budget_min is None  # same scenes, all of them
    assert oracle.run.dir != detector.run.dir
    with pytest.raises(ConfigError, match="nonexistent"):
        arm_configs(compose, replace(bench, main_job_learner="nonexistent"), tmp_path)
