"""`robot-rl bench detector`: its settings, the sim episodes it records (labelled by the ground truth,
frames thinned), and its ROC-AUC."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from robot_rl.app.config import VerdictMode
from robot_rl.bench.detector import Attempt, record_episode, roc_auc, run_detector_bench
from robot_rl.bench.detector_main_job import arm_configs
from robot_rl.config import ConfigError, load_config
from tests.detector_helpers import one_torch_thread  # noqa: F401 (a fixture)


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


def write_judged(root, sources: list[str]) -> list[bool]:
    """Synthetic "place" episodes (tests.detector_helpers) stored by the recorder a robot uses, each judged by
    the given source; returns their outcomes."""
    from robot_rl.core.types import Step
    from robot_rl.data.recorder import EpisodeRecorder
    from tests.detector_helpers import SIZE, synthetic_episode

    rng = np.random.default_rng(0)
    outcomes = []
    with EpisodeRecorder(root, fps=30, joint_names=tuple(f"j{i}" for i in range(6)),
                         cameras={"wrist": (SIZE, SIZE)}) as recorder:
        for i, source in enumerate(sources):
            episode = synthetic_episode(rng, success=bool(i % 2))
            frames = episode.frames["front"]
            steps = [Step(tick=t, time_s=t / 30, state=np.zeros(6, np.float32), action=np.zeros(6, np.float32),
                          images={"wrist": frame}, instruction="put the red cube in the bowl",
                          done=t == len(frames) - 1, success=episode.success and t == len(frames) - 1,
                          success_source=source) for t, frame in enumerate(frames)]
            recorder.write_steps("put the red cube in the bowl", i, steps, finalize=False)  # once, at close
            outcomes.append(episode.success)
    return outcomes


@pytest.mark.usefixtures("one_torch_thread")
def test_a_logged_dataset_s_judged_episodes_teach_and_test_the_detector_in_stored_order(tmp_path):
    sources = ["operator"] * 16 + ["detector", ""] + ["task"] * 10
    outcomes = write_judged(tmp_path / "ds", sources)
    cfg = load_config(["+bench=detector", "bench.labelled=[8,16]", f"bench.episodes_from={tmp_path / 'ds'}",
                       "learner.detector.backbone_seeds=[0]", "learner.detector.calibration_folds=3"])
    report = run_detector_bench(cfg, progress=False)
    assert report["families"] == ["place"]  # the sim's place wording names its family
    place = report["per_family"]["place"]
    # the first 16 judged teach, the 10 after them (the detector's and nobody's verdicts left out) test
    assert place["test_episodes"] == 10 and place["test_successes"] == sum(outcomes[18:])
    assert place["labelled_successes"] == sum(outcomes[:16])
    assert report["accuracy"][16] >= 0.8  # the synthetic place is easy: far above the test's 50 % by chance


def test_a_logged_dataset_without_enough_judged_episodes_is_refused_in_one_line(tmp_path):
    write_judged(tmp_path / "ds", ["operator"] * 6)
    cfg = load_config(["+bench=detector", "bench.labelled=[8]", f"bench.episodes_from={tmp_path / 'ds'}"])
    with pytest.raises(ConfigError, match="has 6 judged episodes"):
        run_detector_bench(cfg, progress=False)
    with pytest.raises(ConfigError, match="not a LeRobotDataset"):
        run_detector_bench(load_config(["+bench=detector", f"bench.episodes_from={tmp_path}"]), progress=False)
