"""`robot-rl bench detector`: how well the success detector judges sim episodes, against the task's ground truth.

Per task family the main job runs (``task_families``), sim episodes are recorded with the detector's cameras:
half by the scripted expert left to finish, half by the expert stopped after a random number of
ticks (then holding still) or with its commands shaken by noise, so the failures are near misses,
not empty scenes. The sim's ground truth (``is_success``, checked every tick; a success ends the
episode, as in the main job) labels each one. A detector (``learner.detector`` settings) is fit on
the first n labelled episodes for every n in ``bench.labelled`` and judged on ``bench.test_episodes``
other scenes: accuracy (at its calibrated threshold), ROC-AUC of its scores, the share of verdicts
it is not sure of (``asked_fraction``: the ones a session would ask a person about) and the
accuracy of the sure ones.

    robot-rl bench detector --json bench_results/detector.json

``bench.episodes_from=DATASET`` measures the same on episodes a robot really ran (a learner's store, a
robot's own dataset): their operator- and task-judged episodes, per task in stored order, take the place
of the recorded ones (``robot_rl.bench.detector_logged``).

``bench.main_job=true`` then runs the main job judged by the sim and by the detector and compares their
final weights on held-out scenes (``robot_rl.bench.detector_main_job``).

Frames are kept at every ``bench.frame_stride``-th tick plus the last ``verdict_frames`` ones:
the detector reads only the first frame, a few early ones and the last ones.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tqdm import tqdm

from robot_rl.bench.config import DetectorBenchConfig
from robot_rl.bench.detector_logged import read_judged, split
from robot_rl.bench.detector_main_job import arm_configs, compare_main_jobs, print_comparison
from robot_rl.hardware.sim import ScriptedExpert, SimConfig, SimSO101
from robot_rl.hardware.sim.tasks import TASK_FAMILIES
from robot_rl.learner.detector import TaskDetector
from robot_rl.learner.detector_config import DetectorConfig
from robot_rl.learner.detector_episodes import LabelledEpisode, PreparedEpisode, prepare

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig

HOLD_TICKS = 15  # a stopped expert holds its last command this long, so the scene settles before the end
TEST_SEED_OFFSET = 50_000  # test scenes start here within the bench's seed range (training scenes below)


@dataclass
class Attempt:
    """How one recorded episode is driven."""

    kind: str  # "expert" | "stopped" | "noisy"
    stop_tick: int = -1  # "stopped": the expert's last own command
    noise_deg: float = 0.0  # "noisy": std of the noise on every command (degrees; gripper units)


def draw_attempt(rng: np.random.Generator, bench: DetectorBenchConfig) -> Attempt:
    if rng.random() >= bench.failure_share:
        return Attempt("expert")
    if rng.random() < 0.5:
        return Attempt("stopped", stop_tick=int(rng.integers(bench.stop_ticks[0], bench.stop_ticks[1] + 1)))
    return Attempt("noisy", noise_deg=bench.noise_deg)


def record_episode(robot: SimSO101, expert: ScriptedExpert, seed: int, family: str, attempt: Attempt,
                   bench: DetectorBenchConfig, verdict_frames: int) -> LabelledEpisode:
    """One episode, labelled by the sim's ground truth; frames thinned as the module doc says."""
    robot.reset(seed=seed, family=family)
    rng = np.random.default_rng(seed)
    kept: dict[int, dict[str, np.ndarray]] = {}
    latest: deque[tuple[int, dict[str, np.ndarray]]] = deque(maxlen=verdict_frames)
    success = False
    command = robot.last_action
    for tick in range(robot.config.max_episode_steps):
        frames = robot.render()
        if tick % bench.frame_stride == 0:
            kept[tick] = frames
        latest.append((tick, frames))
        if attempt.kind == "stopped" and tick > attempt.stop_tick + HOLD_TICKS:
            break
        if attempt.kind != "stopped" or tick <= attempt.stop_tick:
            command = expert.act()
            if attempt.kind == "noisy":
                command = command + rng.normal(0.0, attempt.noise_deg, size=command.shape).astype(np.float32)
        robot.send_action(command)
        if robot.is_success():  # as in the main job: the task ends the episode; its frames are the observations
            success = True      # before each command, so the last one shows the success about to happen
            break
    kept.update(dict(latest))
    ticks = sorted(kept)
    cameras = robot.camera_names
    frames_by_camera = {cam: np.stack([kept[t][cam] for t in ticks]) for cam in cameras}
    return LabelledEpisode(task=family, frames=frames_by_camera, success=success)


def record_family(family: str, seeds: range, bench: DetectorBenchConfig, detector: DetectorConfig,
                  progress: bool) -> list[PreparedEpisode]:
    """The family's episodes on ``seeds``, prepared for the detector as they come (memory stays small)."""
    robot = SimSO101(SimConfig(cameras=detector.cameras))
    robot.connect()
    expert = ScriptedExpert(robot)
    rng = np.random.default_rng(seeds.start)
    try:
        return [prepare(record_episode(robot, expert, seed, family, draw_attempt(rng, bench), bench,
                                       detector.verdict_frames), detector)
                for seed in tqdm(seeds, desc=f"{family} episodes", disable=not progress, leave=False)]
    finally:
        robot.disconnect()


def roc_auc(scores: np.ndarray, outcomes: np.ndarray) -> float:
    """Probability that a random success scores above a random failure (ties count half); nan with one outcome."""
    outcomes = outcomes.astype(bool)
    positives, negatives = scores[outcomes], scores[~outcomes]
    if not len(positives) or not len(negatives):
        return float("nan")
    above = (positives[:, None] > negatives[None, :]).sum() + 0.5 * (positives[:, None] == negatives[None, :]).sum()
    return float(above / (len(positives) * len(negatives)))


def judge(detector: TaskDetector, test: list[PreparedEpisode]) -> dict[str, float]:
    verdicts = [detector.verdict(detector.score_prepared(e)) for e in test]
    outcomes = np.array([e.success for e in test])
    right = np.array([v.success for v in verdicts]) == outcomes
    sure = np.array([v.sure for v in verdicts])
    return {"accuracy": float(right.mean()), "auc": roc_auc(np.array([v.score for v in verdicts]), outcomes),
            "asked_fraction": float(1.0 - sure.mean()),
            "sure_accuracy": float(right[sure].mean()) if sure.any() else float("nan")}


def bench_family(family: str, base_seed: int, bench: DetectorBenchConfig, config: DetectorConfig,
                 progress: bool) -> dict[str, Any]:
    started = time.perf_counter()
    labelled = record_family(family, range(base_seed, base_seed + max(bench.labelled)), bench, config, progress)
    test_start = base_seed + TEST_SEED_OFFSET
    test = record_family(family, range(test_start, test_start + bench.test_episodes), bench, config, progress)
    return {**fit_and_judge(labelled, test, bench, config), "record_s": time.perf_counter() - started}


def fit_and_judge(labelled: list[PreparedEpisode], test: list[PreparedEpisode], bench: DetectorBenchConfig,
                  config: DetectorConfig) -> dict[str, Any]:
    """A detector fit on the first n of ``labelled`` for each n in ``bench.labelled``, judged on ``test``."""
    rows: dict[int, dict[str, float]] = {}
    for n in bench.labelled:
        detector = TaskDetector(config)
        fit_started = time.perf_counter()
        calibration = detector.fit(labelled[:n])
        rows[n] = {**judge(detector, test), "heldout_accuracy": calibration.heldout_accuracy,
                   "threshold": calibration.threshold, "margin": calibration.margin,
                   "fit_s": time.perf_counter() - fit_started}
    return {"rows": rows, "labelled_successes": int(sum(e.success for e in labelled)),
            "test_successes": int(sum(e.success for e in test)), "test_episodes": len(test)}


def logged_families(bench: DetectorBenchConfig, config: DetectorConfig) -> dict[str, dict[str, Any]]:
    """``bench.episodes_from``'s tasks, each fit on its first judged episodes and judged on the rest."""
    started = time.perf_counter()
    logged = read_judged(str(bench.episodes_from), config)
    read_s = time.perf_counter() - started
    print(f"{bench.episodes_from}: judged episodes per task {({t: len(e) for t, e in logged.by_task.items()})}, "
          f"left out {dict(logged.left_out) or 'none'}")
    most = max(bench.labelled)
    return {task: {**fit_and_judge(*split(episodes, most, task), bench, config), "record_s": read_s}
            for task, episodes in logged.by_task.items()}


def run_detector_bench(cfg: RobotRLConfig, progress: bool = True) -> dict[str, Any]:
    bench: DetectorBenchConfig = cfg.bench
    config: DetectorConfig = cfg.learner.detector
    families = list(cfg.task_families or TASK_FAMILIES)
    base = cfg.seeds.eval + cfg.seed
    # The classifier's trainable part is tiny: with more than one thread per op, its threads only wait
    # on each other (20x slower on a loaded 2-core box).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if bench.episodes_from:
            per_family = logged_families(bench, config)
            families = list(per_family)
        else:
            per_family = {family: bench_family(family, base + i * cfg.seeds.stride, bench, config, progress)
                          for i, family in enumerate(families)}
    finally:
        torch.set_num_threads(threads)

    def mean(metric: str) -> dict[int, float]:
        return {n: float(np.mean([per_family[f]["rows"][n][metric] for f in families])) for n in bench.labelled}

    asked_at = min((n for n in bench.labelled if n >= bench.asked_after), default=max(bench.labelled))
    return {"families": families, "labelled": list(bench.labelled), "episodes_from": bench.episodes_from,
            "test_episodes": {f: per_family[f]["test_episodes"] for f in families},
            "accuracy": mean("accuracy"), "auc": mean("auc"), "sure_accuracy": mean("sure_accuracy"),
            "asked_fraction": mean("asked_fraction")[asked_at], "asked_after": asked_at,
            "per_family": per_family}


def print_table(report: dict[str, Any]) -> None:
    logged = report["episodes_from"]
    judged_by = f"the verdicts stored in {logged}" if logged else "the sim's ground truth"
    print(f"\nsuccess detector against {judged_by} (test episodes per family: {report['test_episodes']})")
    print("| family | labelled | accuracy | ROC-AUC | asked | accuracy when sure | held-out acc. | fit s |")
    print("|---|---|---|---|---|---|---|---|")
    for family, result in report["per_family"].items():
        for n, row in result["rows"].items():
            print(f"| {family} | {n} | {row['accuracy']:.1%} | {row['auc']:.3f} | {row['asked_fraction']:.0%} | "
                  f"{row['sure_accuracy']:.1%} | {row['heldout_accuracy']:.1%} | {row['fit_s']:.0f} |")
    for family, result in report["per_family"].items():
        print(f"{family}: {result['labelled_successes']} successes among the labelled, "
              f"{result['test_successes']}/{result['test_episodes']} among the test episodes; "
              f"recorded or read in {result['record_s']:.0f} s")
    print(f"asked after {report['asked_after']} labelled: {report['asked_fraction']:.0%} of verdicts")


def run_from_cli(cfg: RobotRLConfig, compose: Callable[[list[str]], RobotRLConfig] | None = None) -> dict[str, Any]:
    """``compose(overrides)``: this command line with more settings (``bench.main_job``'s two main jobs)."""
    main_jobs = None
    if cfg.bench.main_job:
        if compose is None:
            raise ValueError("bench detector's main jobs compose their configs: give it compose")
        out_dir = Path(cfg.output_dir) / "bench_detector" / time.strftime("%Y%m%d-%H%M%S")
        main_jobs = arm_configs(compose, cfg.bench, out_dir)
    report = run_detector_bench(cfg)
    print_table(report)
    if main_jobs is not None:
        report.update(compare_main_jobs(main_jobs, out_dir))
        print_comparison(report)
    return report
