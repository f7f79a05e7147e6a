"""ACT's temporal ensembling on the edge (``edge.temporal_ensemble_coeff``).

What must hold: where one chunk lands at every tick, each starting at that tick, the queue executes
exactly what LeRobot's own ``ACTTemporalEnsembler`` gives; on an asynchronous node, whose chunks land
after a delay and are time-aligned first, each executed action is the weighted average of every
spliced chunk's prediction for its tick.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lerobot.policies.act.modeling_act import ACTTemporalEnsembler

from robot_rl.core.clock import VirtualClock
from robot_rl.core.types import ActionChunk
from robot_rl.edge import EdgeConfig, EdgeNode
from robot_rl.edge.action_queue import ActionQueue
from robot_rl.edge.node import PlanUpdate
from tests.edge_fakes import EncodingPolicy, KinematicRobot


@pytest.mark.parametrize("coeff", [0.01, 0.5])
def test_a_chunk_every_tick_executes_what_lerobots_ensembler_gives(coeff):
    chunk_size, ticks = 5, 14
    chunks = np.random.default_rng(0).normal(size=(ticks, chunk_size, 3)).astype(np.float32)
    ensembler = ACTTemporalEnsembler(coeff, chunk_size)
    queue = ActionQueue()
    for tick, actions in enumerate(chunks):
        queue.splice(ActionChunk(actions, chunk_id=tick, policy_version=0, request_tick=tick), ensemble_coeff=coeff)
        taken = queue.take()
        assert taken is not None
        expected = ensembler.update(torch.from_numpy(actions)[None])[0].numpy()
        np.testing.assert_allclose(taken.action, expected, rtol=1e-5, atol=1e-6)
        assert taken.predictions == min(tick + 1, chunk_size)


def test_an_asynchronous_node_executes_the_average_of_every_prediction_for_the_tick():
    plans: list[PlanUpdate] = []
    config = EdgeConfig(mode="async_rollforward", simulated_latency_ms=100.0, replan="continuous",
                        temporal_ensemble_coeff=0.0, plan_before_start=False)
    node = EdgeNode(KinematicRobot(), EncodingPolicy(chunk_size=10), VirtualClock(), config)
    node.plan_sink = plans.append
    with node:
        episode = node.run_episode(40, "go")
    averaged = 0
    for step in episode.steps:
        if step.chunk_id < 0:
            continue  # held: nothing planned yet
        predictions = [plan.chunk[step.tick - plan.tick - plan.start_offset] for plan in plans
                       if plan.tick <= step.tick and 0 <= step.tick - plan.tick - plan.start_offset < len(plan.chunk)]
        np.testing.assert_allclose(step.action, np.mean(predictions, axis=0), rtol=1e-6)
        averaged += len(predictions) > 1
    assert averaged >= 20  # continuous re-planning overlaps most ticks


def test_temporal_ensembling_and_seam_blending_are_refused_together():
    with pytest.raises(ValueError, match="temporal_ensemble_coeff must be >= 0 and replaces blend_ticks"):
        EdgeConfig(temporal_ensemble_coeff=0.01, blend_ticks=3)
