"""Closed-loop evaluation of checkpoints through the real EdgeNode, compared on the same scenes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from robot_rl.app.evaluation import (
    HeldoutJob,
    compare_policies,
    dataset_scenes,
    eval_scenes,
    evaluate_on_scenes,
    paired_comparison,
    seed_scenes,
)
from robot_rl.config import ConfigError, load_config
from robot_rl.edge import EdgeConfig
from robot_rl.hardware.sim import ScriptedExpert
from robot_rl.replay import load_logged_dataset
from robot_rl.replay.joint_mapping import JointMapping
from tests.test_replay import IMAGE, make_robot, record_expert_dataset

# The edge runs async with roll-forward on a virtual clock: the code path a robot runs.
# Latency 0 here because the expert stand-in re-plans from the last *executed* command,
# so with latency it advances only one rate-limited step per chunk and gets slow
# (simulated latency is exercised by the CLI test below).
EDGE = EdgeConfig(mode="async_rollforward", simulated_latency_ms=0.0, inference_runner="virtual")
MAX_STEPS = 150


class ExpertChunkPolicy:
    """A "good checkpoint": the scripted expert's next command as a one-action chunk.

    It reads privileged sim state, so it is no learned policy, but it exercises the same
    EdgeNode path (queue, roll-forward, splice) as one.
    """

    chunk_size = 1
    action_dim = 6

    def __init__(self, robot) -> None:
        self.expert = ScriptedExpert(robot)

    def predict_chunk(self, observation, state, instruction) -> np.ndarray:
        return np.repeat(self.expert.act()[None], self.chunk_size, axis=0)

    def save_pretrained(self, directory) -> None:  # pragma: no cover - protocol only
        raise NotImplementedError


class HoldPolicy:
    """A "bad checkpoint": keeps the arm where it is."""

    chunk_size = 4
    action_dim = 6

    def predict_chunk(self, observation, state, instruction) -> np.ndarray:
        return np.repeat(np.asarray(state, np.float32)[None], self.chunk_size, axis=0)

    def save_pretrained(self, directory) -> None:  # pragma: no cover - protocol only
        raise NotImplementedError


@pytest.fixture(scope="module")
def robot():
    robot = make_robot()
    yield robot
    robot.disconnect()


def test_comparison_ranks_the_better_checkpoint_first(robot):
    scenes = seed_scenes(4, first_seed=11)
    evals = compare_policies(robot, {"hold": HoldPolicy(), "expert": ExpertChunkPolicy(robot)}, EDGE, scenes,
                             max_steps=MAX_STEPS, progress=False)
    best, worst = evals
    assert [best.name, worst.name] == ["expert", "hold"]
    assert best.result.success_rate == 1.0 and worst.result.success_rate == 0.0
    assert best.result.ci95[0] > worst.result.ci95[1]  # 4/4 vs 0/4: the Wilson intervals do not overlap
    assert best.result.completion_s < MAX_STEPS / robot.fps
    # Same scenes for both: every episode i started from the same seed and instruction.
    for a, b in zip(best.result.episodes, worst.result.episodes, strict=True):
        assert (a.seed, a.instruction) == (b.seed, b.instruction)
    assert best.intervention_free_rate == 1.0  # nobody intervenes without an operator
    # The paired test reads the 2x2 table of those scenes: 4 solved only by the expert, none only by
    # hold, so the exact two-sided McNemar p is 2 * 0.5**4.
    paired = paired_comparison(best, worst)
    assert (paired.scenes, paired.only_a, paired.only_b) == (4, 4, 0)
    assert paired.p_value == pytest.approx(2 * 0.5**4) and paired.difference == 1.0


def test_seed_scenes_rotate_the_configured_task_families(robot):
    """Seeded scenes run the configured families in turn, not whatever family each seed draws."""
    families = ["place", "push"]
    result = evaluate_on_scenes(robot, HoldPolicy(), EDGE, seed_scenes(4, 11, families), max_steps=2, progress=False)
    assert [e.task_family for e in result.result.episodes] == ["place", "push", "place", "push"]
    assert [e.seed for e in result.result.episodes] == [11, 12, 13, 14]


def test_eval_scenes_come_from_the_configured_seeds_and_families(robot, tmp_path):
    cfg = load_config(["task_families=[push,place]", "eval.episodes=3", "seeds.eval=70"])
    scenes = eval_scenes(cfg, robot)
    assert [(s.seed, s.family) for s in scenes] == [(70, "push"), (71, "place"), (72, "push")]
    corrupt = tmp_path / "corrupt"
    (corrupt / "meta").mkdir(parents=True)
    (corrupt / "meta" / "info.json").write_text("{not json")
    with pytest.raises(ConfigError, match="could not read dataset"):  # one line in the CLI, no traceback
        eval_scenes(load_config([f"eval.dataset={corrupt}"]), robot)


def test_heldout_scenes_are_unseen_and_travel_to_the_child_as_json():
    """The held-out job scores on seeds.heldout onwards (shifted by the root seed), families rotating."""
    job = HeldoutJob.of(load_config(["seed=3", "task_families=[push,pick]", "edge.simulated_latency_ms=40"]), 3)
    assert job.seeds == [9_000_003, 9_000_004, 9_000_005] and job.families == ["push", "pick"]
    back = HeldoutJob.from_json(job.to_json())
    assert back.seeds == job.seeds and back.families == job.families
    assert back.edge == job.edge and back.edge.simulated_latency_ms == 40.0
    assert back.robot.image_height == job.robot.image_height


def test_interventions_count_against_the_intervention_free_rate(robot):
    """An intervention hook (stand-in for an operator) that takes over in episode 1 only."""

    def factory(episode: int):
        if episode != 1:
            return None
        return lambda observation: np.asarray(observation["state"], np.float32)

    result = evaluate_on_scenes(robot, HoldPolicy(), EDGE, seed_scenes(2, 11), "hold", max_steps=20,
                                intervention_factory=factory, progress=False)
    assert result.intervention_free_rate == 0.5
    assert result.result.episodes[1].intervention_steps == 20


def test_eval_from_dataset_scenes_starts_where_the_episodes_started(robot, tmp_path):
    episodes = record_expert_dataset(robot, tmp_path / "ds", which=[(5, "push")])
    dataset = load_logged_dataset(str(tmp_path / "ds"))
    scenes = dataset_scenes(dataset, JointMapping(), robot.joint_names)
    result = evaluate_on_scenes(robot, HoldPolicy(), EDGE, scenes, max_steps=5, progress=False)
    for logged, evaluated in zip(episodes, result.result.episodes, strict=True):
        assert evaluated.instruction == logged.instruction
        np.testing.assert_allclose(evaluated.steps[0].state, logged.steps[0].state, atol=0.05)


def test_eval_cli_compares_two_checkpoints(tmp_path, monkeypatch, capsys):
    import torch

    from robot_rl.commands import evaluate
    from robot_rl.policies.flow_vla import FlowVLA
    from robot_rl.policies.text_encoder import InstructionEncoder
    from tests.learner_helpers import TEXT, tiny_policy_config

    monkeypatch.setattr(InstructionEncoder, "_shared", TEXT)  # offline stand-in: skip the 90 MB encoder load
    config = tiny_policy_config()
    config.cameras = ("front", "wrist")
    for name, seed in (("a", 0), ("b", 1)):
        torch.manual_seed(seed)
        FlowVLA(config, text_encoder=TEXT).save_pretrained(tmp_path / name)
    code = evaluate.main([f"policy.path={tmp_path / 'a'}", f"eval.compare_path={tmp_path / 'b'}", "eval.episodes=2",
                          "eval.max_episode_steps=8", f"output_dir={tmp_path / 'out'}", f"robot.image_height={IMAGE}",
                          f"robot.image_width={IMAGE}", "edge.simulated_latency_ms=50"])
    assert code == 0
    report = json.loads((tmp_path / "out" / "eval" / "eval.json").read_text())
    assert sorted(report["ranking"]) == sorted([str(tmp_path / "a"), str(tmp_path / "b")])
    for checkpoint in report["checkpoints"]:
        assert checkpoint["episodes"] == 2 and len(checkpoint["ci95"]) == 2
    assert report["edge"]["simulated_latency_ms"] == 50.0
    assert (tmp_path / "out" / "eval" / "eval.png").stat().st_size > 0
    paired = report["paired"]  # the same 2 scenes for both: compared scene by scene
    wins = [c["per_episode_success"] for c in report["checkpoints"]]
    assert paired["scenes"] == 2 and paired["only_a"] == sum(x and not y for x, y in zip(*wins, strict=True))
    for checkpoint in report["checkpoints"]:  # the root task_families (default: push) chose the scenes' tasks
        assert list(checkpoint["per_family"]) == ["push"]
    out = capsys.readouterr().out
    assert "closed-loop evaluation" in out and "scene by scene" in out and "exact McNemar p" in out
