"""Published versions scored while the main job runs: one child scores the newest version whenever it
is free and the trainer is far enough past the last one scored, on the same held-out scenes each
time, and a version it cannot score costs only its point; each point scores each task family too."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from robot_rl.app.heldout_monitor import POLL_S, HeldoutMonitor
from robot_rl.config import load_config
from robot_rl.policies.flow_vla import FlowVLA
from tests.learner_helpers import TINY_SIM, tiny_policy_config, wait_for


class PublishingTrainer:
    """What the monitor reads of a trainer: the newest version, and a copy of its weights."""

    def __init__(self, weights: Path) -> None:
        self.version = 0
        self.step = 0
        self.weights = weights
        self.broken = False  # the next copies are no loadable policy

    def save_deployed(self, directory: Path) -> tuple[int, int]:
        shutil.rmtree(directory, ignore_errors=True)
        if self.broken:
            directory.mkdir(parents=True)
            (directory / "config.json").write_text("{not json")
        else:
            shutil.copytree(self.weights, directory)
        return self.step, self.version


def test_the_newest_version_is_scored_on_the_same_scenes_and_a_failure_costs_only_its_point(tmp_path):
    config = tiny_policy_config()
    config.cameras = ("front", "wrist")
    FlowVLA(config).save_pretrained(tmp_path / "weights")
    trainer = PublishingTrainer(tmp_path / "weights")
    cfg = load_config([*TINY_SIM, "robot.max_episode_steps=4", "task_families=[push,pick]"])
    episodes = [0]
    monitor = HeldoutMonitor(trainer, cfg, tmp_path / "heldout", scenes=2, episodes=lambda: episodes[0],
                             every_updates=100).start()
    try:
        trainer.version, trainer.step, episodes[0] = 3, 300, 12
        wait_for(lambda: len(monitor.points) == 1, timeout_s=120, what="v3 scored")
        trainer.broken, trainer.version, trainer.step = True, 4, 350  # a new version, too few updates on
        time.sleep(3 * POLL_S)
        assert monitor.failed_versions == [] and len(monitor.points) == 1
        trainer.step = 420
        wait_for(lambda: monitor.failed_versions == [4], timeout_s=60, what="the broken copy tried")
        trainer.broken, trainer.version, trainer.step, episodes[0] = False, 6, 600, 30
        wait_for(lambda: len(monitor.points) == 2, timeout_s=60, what="v6 scored")
    finally:
        points = monitor.stop()
    assert [(p.version, p.updates, p.episodes, p.scenes) for p in points] == [(3, 300, 12, 2), (6, 600, 30, 2)]
    assert all(p.success == 0.0 and p.ci95[0] == 0.0 < p.ci95[1] for p in points)  # untrained: 0 of 2
    assert points[0].wall_s <= points[1].wall_s
    # the families rotate over the scenes: one each, scored on its own
    assert all(p.by_family == {f: {"success": 0.0, "ci95": [0.0, 0.793], "scenes": 1} for f in ("push", "pick")}
               for p in points)
