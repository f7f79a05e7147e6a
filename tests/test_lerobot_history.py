"""Observation history: a LeRobot Diffusion Policy with ``n_obs_steps=2`` (LeRobot's default) on the edge
and on the learner.

What must hold: each chunk the edge asks for is predicted from the observation of the request's tick and
the one the robot showed at the tick before (the first of an episode repeated, as LeRobot's own queues
do), and the learner trains it on samples that carry the recorded observation before the sampled step
and a target that starts at it, as LeRobot's dataset gives them (``observation_delta_indices`` [-1, 0],
``action_delta_indices`` from -1).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
from lerobot.processor import NormalizerProcessorStep, TransitionKey, create_transition

from robot_rl.core.clock import VirtualClock, WallClock
from robot_rl.edge.config import EdgeConfig
from robot_rl.edge.node import EdgeNode, PlanUpdate
from robot_rl.edge.process_runner import spawn_policy
from robot_rl.learner.index import SampleSpec
from robot_rl.learner.serving import PolicyServer, robot_noise_seed, torch_rng_from
from robot_rl.learner.serving_config import ServeConfig
from robot_rl.learner.trainer import Trainer
from robot_rl.policies.base import HistoryChunkPolicy, ObservationHistory, PastObservation
from robot_rl.policies.lerobot_adapter import LeRobotChunkPolicy
from robot_rl.policies.trainable import StateOffsets
from tests.edge_fakes import FrameCountingRobot, PastEchoPolicy
from tests.learner_helpers import BC, CAMERAS, IMG, trainer_config
from tests.lerobot_policies import (  # noqa: F401 - one_torch_thread: an autouse fixture
    one_torch_thread,
    swap_in_mid_episode,
    tiny_diffusion_dir,
)
from tests.test_learner_trainer import filled_index
from tests.test_serving import INSTRUCTION, STATE, as_received, frame, remote, runner_of, wait_result
from tests.test_serving import request as chunk_request
from tests.test_stream_swap import same_weights

CHUNK = 4
OBS_STATE, FRONT = "observation.state", "observation.images.front"


@pytest.fixture(scope="module")
def diffusion_dir(tmp_path_factory):
    return tiny_diffusion_dir(tmp_path_factory.mktemp("diffusion2"), cameras=CAMERAS, image_size=IMG,
                              chunk_size=CHUNK, horizon=2 * CHUNK, n_obs_steps=2)


def load(diffusion_dir) -> LeRobotChunkPolicy:
    return LeRobotChunkPolicy.from_pretrained(diffusion_dir, device="cpu", state_offsets=StateOffsets(2))


@contextlib.contextmanager
def serving(policy) -> Iterator[PolicyServer]:
    server = PolicyServer(policy, ServeConfig(endpoint="tcp://127.0.0.1:*")).start()
    try:
        yield server
    finally:
        server.close()


def pixel_value(normalised: torch.Tensor) -> int:
    """The frame's pixel value back from the tiny policy's normalised image (mean 0.5, std 0.25)."""
    return round((float(normalised.mean()) * 0.25 + 0.5) * 255)


def test_the_edge_predicts_each_chunk_from_the_previous_ticks_observation_and_its_own(diffusion_dir):
    policy = load(diffusion_dir).eval()
    assert policy.observation_history == ObservationHistory(steps=2, past_actions=1)
    received: list[dict[str, torch.Tensor]] = []
    predict = policy.policy.predict_action_chunk

    def spy(batch, **kwargs):  # what LeRobot's Diffusion itself is given
        received.append({key: batch[key].clone() for key in (OBS_STATE, FRONT)})
        return predict(batch, **kwargs)

    policy.policy.predict_action_chunk = spy
    robot = FrameCountingRobot(IMG, step=10)
    node = EdgeNode(robot, policy, VirtualClock(), EdgeConfig(fps=30, simulated_latency_ms=40))
    with node:
        node.reset_episode("pick the cube")
        for _ in range(12):
            node.tick()
    requests = node.stats.chunks
    assert len(received) == len(requests) >= 3
    normalise = policy.preprocessor_step(NormalizerProcessorStep)
    for batch, request in zip(received, requests, strict=True):
        assert batch[OBS_STATE].shape == (1, 2, 6) and batch[FRONT].shape == (1, 2, 3, IMG, IMG)
        tick = request.request_tick
        earlier = max(tick - 1, 0)  # the first request of an episode repeats its own observation
        assert [pixel_value(batch[FRONT][0, i]) for i in (0, 1)] == [10 * earlier, 10 * tick]
        before = robot.seen[earlier] if tick > 0 else request.policy_state  # measured then; at tick 0, this one
        states = normalise(create_transition(observation={OBS_STATE: torch.as_tensor(
            np.stack([before, request.policy_state]))}))[TransitionKey.OBSERVATION][OBS_STATE]
        torch.testing.assert_close(batch[OBS_STATE][0], states)  # and the state given now (rolled forward)
    later = [(batch, request) for batch, request in zip(received, requests, strict=True) if request.request_tick > 0]
    assert later and all(not torch.equal(b[FRONT][0, 0], b[FRONT][0, 1]) for b, _ in later)


def requested_chunks(robot: FrameCountingRobot, policy: Any) -> list[tuple[int, np.ndarray]]:
    """A 20-tick episode on ``policy`` (closed after it): each planned chunk with the tick it was asked at."""
    plans: list[PlanUpdate] = []
    node = EdgeNode(robot, policy, WallClock(), EdgeConfig(fps=30, replan="continuous"))
    node.plan_sink = plans.append
    try:
        node.run_episode(20, "go")
    finally:
        node.close()
        policy.close()
    asked_at = {record.chunk_id: record.request_tick for record in node.stats.chunks}
    return [(asked_at[plan.chunk_id], plan.chunk) for plan in plans]


def test_a_policy_in_its_own_process_gets_the_previous_ticks_observation_with_each_request():
    policy = spawn_policy(PastEchoPolicy)
    assert isinstance(policy, HistoryChunkPolicy) and policy.observation_history.steps == 2
    given = [(tick, chunk[0, 0], chunk[0, 1]) for tick, chunk in requested_chunks(FrameCountingRobot(), policy)]
    assert len(given) >= 3 and any(tick > 0 for tick, _, _ in given)
    # The frame counter of the tick before, then the request's own; at tick 0 nothing came before.
    assert all((earlier, now) == ((tick - 1 if tick > 0 else -1), tick) for tick, earlier, now in given)


def test_a_served_diffusion_policy_predicts_from_the_past_observation_sent_as_its_local_copy_does(diffusion_dir):
    with serving(load(diffusion_dir).eval()) as server:
        policy = remote(server, "arm-a")
        try:
            assert policy.observation_history.steps == 2  # announced in policy_info: the node keeps one
            size = policy.info.frames["front"].height
            past_image, image, past_state = frame(1, size), frame(2, size), STATE + 0.3
            runner = runner_of(policy)
            past = PastObservation({"front": past_image}, past_state)
            runner.submit(dataclasses.replace(chunk_request(1, image), history=(past,)))
            served_chunk = wait_result(runner)
            assert served_chunk.error is None
        finally:
            policy.close()
    local = load(diffusion_dir).eval()

    def local_chunk(history: list[PastObservation]) -> np.ndarray:
        """The robot's own copy of the policy on what the server decodes, from the robot's noise stream."""
        with torch_rng_from(torch.Generator().manual_seed(robot_noise_seed(0, "arm-a"))):
            return local.predict_chunk_with_history(history, {"front": as_received(image)}, STATE, INSTRUCTION)

    np.testing.assert_allclose(served_chunk.chunk.actions,
                               local_chunk([PastObservation({"front": as_received(past_image)}, past_state)]),
                               atol=1e-5)
    assert not np.allclose(served_chunk.chunk.actions, local_chunk([]), atol=1e-3)  # the past observation counted


def test_a_served_edge_node_sends_the_previous_ticks_observation_with_each_request():
    with serving(PastEchoPolicy()) as server:
        chunks = requested_chunks(FrameCountingRobot(step=10), remote(server, "arm-a"))
    # The frames' pixel values (10 x the tick) back through JPEG, within its rounding.
    given = [(tick, round(chunk[0, 0] / 10), round(chunk[0, 1] / 10)) for tick, chunk in chunks]
    assert len(given) >= 3 and any(tick > 0 for tick, _, _ in given)
    # The frame of the tick before, then the request's own; at tick 0 nothing came before (-1 / 10 rounds to 0).
    assert all((earlier, now) == ((tick - 1 if tick > 0 else 0), tick) for tick, earlier, now in given)
    assert any(tick > 1 for tick, _, _ in given)


def test_a_request_with_more_past_observations_than_the_served_policy_reads_is_refused_in_one_line():
    seen = PastObservation({"front": np.full((IMG, IMG, 3), 70, np.uint8)}, STATE)
    now = {"front": np.full((IMG, IMG, 3), 80, np.uint8)}
    with serving(PastEchoPolicy()) as server:
        policy = remote(server, "arm-a")
        try:
            with pytest.raises(RuntimeError, match=r"infer: 2 past observations, but the served policy reads 1 "
                                                   r"before the current one \(policy_info observation_steps=2\)"
                               ) as refused:
                policy.predict_chunk_with_history([seen, seen], now, STATE, INSTRUCTION)
            assert "\n" not in str(refused.value) and server.stats.refused == 1
            chunk = policy.predict_chunk_with_history([seen], now, STATE, INSTRUCTION)  # as many as it reads
            assert abs(chunk[0, 0] - 70) <= 2 and abs(chunk[0, 1] - 80) <= 2
        finally:
            policy.close()


def test_the_learner_samples_the_observation_before_each_step_and_a_target_that_starts_at_it(diffusion_dir):
    policy = load(diffusion_dir)
    spec = SampleSpec(policy.training_horizon, CAMERAS, 2, history=policy.observation_history)
    batch = filled_index().sample(32, {"online": 1.0, "intervention": 1.0, "demonstration": 1.0}, spec,
                                  np.random.default_rng(0))
    assert batch["past.state"].shape == (32, 1, 6) and batch["past.images.front"].shape == (32, 1, IMG, IMG, 3)
    assert batch["actions"].shape == (32, 2 * CHUNK, 6)
    ticks = [int(v) // 7 for v in batch["images.front"][:, 0, 0, 0]]  # tests.learner_helpers.make_step's frames
    assert 0 in ticks and any(t > 0 for t in ticks)
    for i, t in enumerate(ticks):
        earlier = max(t - 1, 0)  # padded at the episode's start by repeating its first step, as LeRobot's dataset
        assert int(batch["past.images.front"][i, 0, 0, 0, 0]) == 7 * earlier
        assert float(batch["past.state"][i, 0, 2]) == earlier
        start = t + int(batch["offset"][i])  # the chunk's first step; the target starts one before it
        assert bool(batch["action_is_pad"][i, 0]) == (start == 0)
        if start > 0:
            assert float(batch["actions"][i, 0, 2]) == start  # make_step's action = state + 1, state[2] = tick


def test_the_learner_trains_it_from_stacked_samples_with_lerobots_loss(diffusion_dir, tmp_path):
    policy = load(diffusion_dir).train()
    spec = SampleSpec(policy.training_horizon, CAMERAS, 2, history=policy.observation_history)
    batch = filled_index().sample(6, {"online": 1.0, "intervention": 1.0, "demonstration": 1.0}, spec,
                                  np.random.default_rng(0))
    batch["action_is_pad"][:] = False
    loss, per_sample = policy.compute_loss(batch, seed=3)
    torch.manual_seed(3)  # the noise and diffusion steps LeRobot's compute_loss draws, in its order
    lerobot_batch = policy.preprocessor(policy._to_lerobot_batch(batch))
    assert lerobot_batch[OBS_STATE].shape == (6, 2, 6) and lerobot_batch[FRONT].shape == (6, 2, 3, IMG, IMG)
    lerobot_loss, _ = policy.policy.forward(lerobot_batch)
    assert per_sample.shape == (6,) and torch.allclose(loss, lerobot_loss, rtol=1e-5)

    conditioned: list[tuple[int, ...]] = []  # the observations Diffusion encodes for each update's loss
    encode = policy.policy.diffusion._prepare_global_conditioning

    def spy(lerobot_batch):
        conditioned.append(tuple(lerobot_batch[OBS_STATE].shape))
        return encode(lerobot_batch)

    policy.policy.diffusion._prepare_global_conditioning = spy
    before = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    trainer = Trainer(policy, filled_index(), trainer_config(tmp_path / "ckpt"), BC)
    metrics = [trainer.update_once() for _ in range(2)]
    assert all(m is not None and np.isfinite(m["loss"]) for m in metrics)
    assert conditioned == [(4, 2, 6)] * 2  # batch_size 4, two observations each
    assert any(not torch.equal(v, policy.state_dict()[k]) for k, v in before.items())

    # What it published swaps into a running edge node that stacks its observations.
    running = load(diffusion_dir).eval()
    node, _ = swap_in_mid_episode(running, trainer.deployed, tmp_path / "spool", "edge-diffusion")
    assert same_weights(node.running_policy, trainer.deployed) and node.stats.swap_failures == 0
    assert node.stats.chunks_spliced >= 2 and node.stats.chunks_rejected == 0
