"""End to end: a weak policy gets better through the whole learner loop, with `rwr`, on CPU.

What runs is what ``robot-rl run`` runs: two simulated SO-101s on the real edge runtime
(wall clock, async inference) with the scripted operator taking over when they go wrong,
streaming over ZeroMQ on loopback to the learner service, which stores, samples mixed online +
correction + demonstration batches, trains with reward-weighted regression (Hi-ORS), publishes
weights and hot-swaps them into the running robots.

It takes ~1.5 minutes on a 2-core machine and its data depends on thread timing, so it is
marked ``long`` and runs with ``make test-long``, not in ``make test``.

The start is a deliberately weak FlowVLA: a tiny model behaviour-cloned for a few hundred
steps on a dozen scripted-expert push demonstrations. It is judged closed-loop through
the EdgeNode (``robot_rl.app.evaluation.evaluate_policy``, virtual clock) on held-out scenes,
before and after the run. The measure is the sim's task progress at the end of each
episode (1.0 on success, else the partial progress of the push): at this CPU budget
success itself is too rare to compare reliably on a few episodes, progress is not.

What drives the improvement here, said plainly: at ~0 % initial success RWR rejects the
failed online episodes, so the gradient comes from the operator's corrections and the
demonstrations; the test proves the loop (store -> index -> rewards -> rwr -> publish ->
robots) turns data into a better policy on the robots. The weights' own math is tested in
test_algorithms.py. Without the operator, 500 updates and 16 evaluation scenes, it passed 1 run
in 3 once the dataset writer moved to its own process (the learner trains faster, the robots
bring fewer episodes per update, and demonstrations alone did not lift the start); with the
operator, 1,000 updates and 32 scenes it passed 3 of 3 (task progress 0.087 -> 0.165-0.202).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import copy
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from robot_rl.app.config import LocalRunConfig
from robot_rl.app.demos import expert_attempts, store_demos
from robot_rl.app.evaluation import evaluate_policy
from robot_rl.app.local_run import make_sim_robot_factory, run_local
from robot_rl.app.main_job import ScriptedOperatorFactory
from robot_rl.core.layout import RecordedLayout
from robot_rl.data import load_episode_arrays
from robot_rl.edge import EdgeConfig
from robot_rl.hardware.sim import ScriptedExpert, SimConfig, SimSO101
from robot_rl.hardware.sim.scene import JOINT_NAMES
from robot_rl.learner.algorithms.config import RWRConfig, StalenessConfig
from robot_rl.learner.checkpoint import read_checkpoint
from robot_rl.learner.config import LearnerConfig, ServiceConfig, StoreConfig, TrainerConfig
from robot_rl.policies.flow_vla import FlowVLA, FlowVLAConfig
from robot_rl.policies.training import fit
from tests.learner_helpers import TEXT

FAMILY = "push"
SIM = SimConfig(image_height=48, image_width=48, cameras=("front",), max_episode_steps=75)
SIM_JOINTS = JOINT_NAMES
DEMO_EPISODES = 12
BC_STEPS = 60  # weak on purpose: the learner loop then has a clear gap to close
LEARNER_UPDATES = 1000
EVAL_SEEDS = list(range(900_000, 900_032))  # held out: demos use 0.., robots 20_000 + 100_000 * i ..
EVAL_EDGE = EdgeConfig(mode="async_rollforward", simulated_latency_ms=0.0, inference_runner="virtual")


def policy_config() -> FlowVLAConfig:
    return FlowVLAConfig(cameras=SIM.cameras, image_size=48, chunk_size=8, cnn_channels=(16, 32, 32), image_grid=3,
                         d_model=48, n_heads=4, n_layers=1, n_expert_layers=1, ffn_mult=2, max_state_offset=2,
                         num_integration_steps=4, normalize_instruction=False, keypoints=0, film_instruction=False,
                         state_noise_std=0.0)


def weak_policy(demos: Path) -> FlowVLA:
    torch.manual_seed(0)
    policy = FlowVLA(policy_config(), text_encoder=TEXT)
    fit(policy, load_episode_arrays(demos), steps=BC_STEPS, batch_size=32, lr=1e-3, device="cpu", seed=0,
        progress=False, schedule="constant")
    return policy.cpu().eval()


def final_progress(robot: SimSO101, policy: FlowVLA) -> tuple[float, float]:
    """(mean task progress at the end of each held-out episode, success rate), reproducibly."""
    torch.manual_seed(0)  # flow-matching inference noise
    result = evaluate_policy(robot, policy, EVAL_EDGE, EVAL_SEEDS, families=[FAMILY], progress=False)
    return float(np.mean([episode.steps[-1].reward for episode in result.episodes])), result.success_rate


def learner_config(root: Path, demos: Path) -> LearnerConfig:
    store = StoreConfig(root=str(root / "store"), fps=SIM.fps, joint_names=SIM_JOINTS, cameras=SIM.cameras,
                        image_height=SIM.image_height, image_width=SIM.image_width, demonstrations=str(demos))
    trainer = TrainerConfig(batch_size=32, lr=1e-3, min_steps_to_train=1,
                            online_ratio=0.25, intervention_ratio=0.25, demonstration_ratio=0.5,
                            max_updates=LEARNER_UPDATES, publish_every_updates=50, publish_every_s=1e9,
                            checkpoint_dir=str(root / "checkpoints"), checkpoint_every_updates=10**9,
                            device="cpu", seed=0, log_every_updates=10)
    service = ServiceConfig(router_endpoint="tcp://127.0.0.1:*", pub_endpoint="tcp://127.0.0.1:*",
                            heartbeat_interval_s=0.2)
    algorithm = RWRConfig(staleness=StalenessConfig(max_staleness=3, mode="downweight"))
    return LearnerConfig(store=store, trainer=trainer, service=service, algorithm=algorithm)


@pytest.fixture(scope="module")
def robot():
    robot = SimSO101(SIM)
    robot.connect()
    yield robot
    robot.disconnect()


@pytest.mark.long  # ~1.5 min of CPU training and robot time: `make test-long`, not `make test`
def test_rwr_through_the_learner_loop_improves_a_weak_policy_on_held_out_scenes(tmp_path, robot):
    started = time.monotonic()
    demos = tmp_path / "demos"
    attempts = expert_attempts(robot, ScriptedExpert(robot), [FAMILY], DEMO_EPISODES)
    summary = store_demos(attempts, RecordedLayout.of_robot(robot), demos, [FAMILY], DEMO_EPISODES, progress=False)
    assert summary.stored == DEMO_EPISODES
    phases = {"demos": time.monotonic() - started}
    policy = weak_policy(demos)
    phases["bc"] = time.monotonic() - started - sum(phases.values())
    before, success_before = final_progress(robot, policy)
    phases["eval_before"] = time.monotonic() - started - sum(phases.values())

    config = learner_config(tmp_path, demos)
    run = LocalRunConfig(num_robots=2, episodes_per_robot=1000, max_steps=SIM.max_episode_steps, segment_steps=15,
                         spool_dir=str(tmp_path / "spool"), image_format="png", edge=EdgeConfig(fps=SIM.fps),
                         until_trained=True)
    result = run_local(config, copy.deepcopy(policy), run, make_sim_robot_factory(SIM, [FAMILY], seed_base=20_000),
                       operator_factory=ScriptedOperatorFactory(SIM.fps))
    phases["learner_loop"] = time.monotonic() - started - sum(phases.values())

    # The loop ran as a whole: robots streamed episodes, the learner trained and published,
    # the robots swapped the new weights in, and outcomes were kept per policy version.
    assert result.updates == LEARNER_UPDATES and result.weights_version == LEARNER_UPDATES // 50
    assert result.episodes >= 4 and result.store["online_steps"] > 0
    assert min(result.robot_versions.values()) >= 1
    assert len(result.per_version) >= 2 and sum(s.episodes for s in result.per_version.values()) == result.episodes
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))

    trained = copy.deepcopy(policy)
    weights, state = read_checkpoint(result.checkpoint)
    assert state.step == LEARNER_UPDATES
    trained.load_state_dict(weights)
    after, success_after = final_progress(robot, trained.eval())
    phases["eval_after"] = time.monotonic() - started - sum(phases.values())

    print(f"\nrwr e2e: task progress {before:.3f} -> {after:.3f}, success {success_before:.0%} -> {success_after:.0%}, "
          f"{result.episodes} robot episodes; seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in phases.items()))
    assert after >= before + 0.05, f"task progress did not rise: {before:.3f} -> {after:.3f}"
    assert success_after >= success_before
