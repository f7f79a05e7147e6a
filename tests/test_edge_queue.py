"""The edge runtime's building blocks: action queue, delay estimator, latency model, clamp, config."""

import numpy as np
import pytest

from robot_rl.core.types import ActionChunk
from robot_rl.edge import ActionQueue, DelayEstimator, EdgeConfig, JointDeltaClamp, LatencyModel, ModeRules


def ramp_chunk(chunk_id: int, horizon: int = 10, base: float = 0.0, dim: int = 2) -> ActionChunk:
    values = base + np.arange(horizon, dtype=np.float32)
    return ActionChunk(np.repeat(values[:, None], dim, axis=1), chunk_id=chunk_id, policy_version=3, request_tick=0)


# ----------------------------------------------------------------------------- queue


def test_take_returns_actions_in_order_then_none():
    queue = ActionQueue()
    assert queue.take() is None and queue.remaining == 0
    queue.splice(ramp_chunk(0, horizon=3))
    taken = [queue.take() for _ in range(4)]
    assert [t.chunk_index for t in taken[:3]] == [0, 1, 2]
    assert taken[3] is None
    assert queue.remaining == 0
    assert queue.last_taken.chunk_index == 2
    assert taken[0].chunk_id == 0 and taken[0].policy_version == 3


def test_splice_drops_stale_actions_so_next_is_chunk_at_stale_index():
    queue = ActionQueue()
    queue.splice(ramp_chunk(0))
    for _ in range(4):
        queue.take()
    queue.splice(ramp_chunk(1, base=100.0), stale=3)
    head = queue.take()
    assert (head.chunk_id, head.chunk_index) == (1, 3)
    assert head.action[0] == 103.0
    assert queue.remaining == 10 - 3 - 1


def test_splice_keeps_old_actions_until_an_early_chunk_is_due():
    queue = ActionQueue()
    queue.splice(ramp_chunk(0))
    queue.take()  # index 0 executed
    queue.splice(ramp_chunk(1, base=100.0), keep=2)
    got = [(a.chunk_id, a.chunk_index) for a in (queue.take() for _ in range(4))]
    assert got == [(0, 1), (0, 2), (1, 0), (1, 1)]


def test_splice_keep_is_capped_by_what_is_left_of_the_old_plan():
    queue = ActionQueue()
    queue.splice(ramp_chunk(0, horizon=3))
    queue.take()
    queue.splice(ramp_chunk(1), keep=5)
    got = [(a.chunk_id, a.chunk_index) for a in (queue.take() for _ in range(3))]
    assert got == [(0, 1), (0, 2), (1, 0)]


def test_splice_limit_queues_only_the_execution_horizon():
    queue = ActionQueue()
    assert queue.splice(ramp_chunk(0), limit=4) == 4
    assert [queue.take().chunk_index for _ in range(4)] == [0, 1, 2, 3]
    assert queue.take() is None


def test_splice_rejects_late_and_early_at_once():
    with pytest.raises(ValueError, match="both"):
        ActionQueue().splice(ramp_chunk(0), stale=1, keep=1)


def test_planned_target_is_chunk_at_k_plus_d_and_last_action_past_the_end():
    chunk = ramp_chunk(0)
    queue = ActionQueue()
    assert queue.planned_target(3) is None  # nothing planned or commanded yet
    queue.splice(chunk)
    for _ in range(5):
        queue.take()
    k = queue.last_taken.chunk_index
    assert k == 4
    assert np.array_equal(queue.planned_target(0), chunk.actions[k])
    for d in (1, 3, 5):
        assert np.array_equal(queue.planned_target(d), chunk.actions[k + d])
    assert np.array_equal(queue.planned_target(50), chunk.actions[-1])
    with pytest.raises(ValueError):
        queue.planned_target(-1)


def test_blend_is_linear_from_the_old_plan_to_the_new_chunk():
    queue = ActionQueue()
    queue.splice(ramp_chunk(0, base=0.0))  # old plan: 0, 1, 2, ...
    queue.take()  # executed 0; old plan would command 1, 2, 3 next
    queue.splice(ramp_chunk(1, base=100.0), stale=1, blend_ticks=3)  # new: 101, 102, 103, 104
    got = [queue.take().action[0] for _ in range(4)]
    expected = [0.75 * 1 + 0.25 * 101, 0.5 * 2 + 0.5 * 102, 0.25 * 3 + 0.75 * 103, 104.0]
    assert np.allclose(got, expected)
    # the raw policy action stays recorded
    queue.splice(ramp_chunk(2, base=200.0), blend_ticks=2, hold=np.zeros(2, np.float32))
    first = queue.take()
    assert first.policy_action[0] == 200.0 and first.action[0] != 200.0


def test_blend_falls_back_to_hold_when_the_old_plan_is_empty():
    queue = ActionQueue()
    hold = np.full(2, 10.0, np.float32)
    queue.splice(ramp_chunk(0, base=40.0), blend_ticks=1, hold=hold)
    assert queue.take().action[0] == pytest.approx(0.5 * 10 + 0.5 * 40)


# ----------------------------------------------------------------------------- delay


def test_delay_estimator_uses_prior_until_measured():
    est = DelayEstimator(window=10, quantile=0.9, prior_ticks=4)
    assert est.estimate() == 4
    est.observe(2)
    assert est.estimate() == 2


def test_delay_estimator_high_quantile_over_sliding_window():
    est = DelayEstimator(window=10, quantile=0.9, prior_ticks=0)
    for d in range(1, 11):  # 1..10
        est.observe(d)
    assert est.estimate() == 9  # 9 of the 10 samples are <= 9
    for _ in range(5):
        est.observe(1)  # 1..5 leave the window
    assert est.samples == [6, 7, 8, 9, 10, 1, 1, 1, 1, 1]
    assert est.estimate() == 9
    for _ in range(5):
        est.observe(1)
    assert est.estimate() == 1


def test_delay_estimator_max_quantile_and_bad_input():
    est = DelayEstimator(window=3, quantile=1.0)
    for d in (3, 7, 5):
        est.observe(d)
    assert est.estimate() == 7
    with pytest.raises(ValueError):
        est.observe(-1)
    with pytest.raises(ValueError):
        DelayEstimator(window=0)


# ----------------------------------------------------------------------------- latency


def test_constant_latency():
    model = LatencyModel(200.0)
    assert [model.sample_s() for _ in range(3)] == [0.2, 0.2, 0.2]


def test_uniform_latency_is_bounded_and_seeded():
    a = [LatencyModel(100.0, 30.0, "uniform", seed=1).sample_s() for _ in range(1)]
    model = LatencyModel(100.0, 30.0, "uniform", seed=1)
    samples = [model.sample_s() for _ in range(200)]
    assert samples[0] == a[0]
    assert min(samples) >= 0.07 and max(samples) <= 0.13
    assert max(samples) - min(samples) > 0.03


def test_lognormal_latency_is_positive_with_median_near_mean():
    model = LatencyModel(150.0, 50.0, "lognormal", seed=0)
    samples = np.array([model.sample_s() for _ in range(2000)])
    assert (samples > 0).all()
    assert np.median(samples) == pytest.approx(0.150, rel=0.05)


def test_measured_latency_is_the_compute_time_and_bad_specs_fail():
    assert LatencyModel(0.0, distribution="measured").sample_s(0.042) == 0.042
    with pytest.raises(ValueError, match="distribution"):
        LatencyModel(10.0, distribution="gamma")
    with pytest.raises(ValueError, match="median"):
        LatencyModel(0.0, distribution="lognormal")


# ----------------------------------------------------------------------------- clamp, config


def test_joint_delta_clamp_per_joint():
    clamp = JointDeltaClamp([1.0, 5.0], num_joints=2)
    out = clamp(np.array([10.0, 10.0], np.float32), np.zeros(2, np.float32))
    assert np.allclose(out, [1.0, 5.0])
    assert JointDeltaClamp(None, 2)(np.array([9.0, 9.0]), np.zeros(2)).tolist() == [9.0, 9.0]
    with pytest.raises(ValueError):
        JointDeltaClamp(0.0, 2)


def test_config_validation_names_the_problem():
    with pytest.raises(ValueError, match="mode must be one of"):
        EdgeConfig(mode="fast")
    with pytest.raises(ValueError, match="delay_quantile"):
        EdgeConfig(delay_quantile=1.5)
    assert EdgeConfig().mode == "async_rollforward"


def test_mode_rules():
    assert ModeRules.for_mode("sync") == ModeRules(rolls_forward=False, drops_stale=False, waits_for_chunk=True)
    assert ModeRules.for_mode("async_naive").drops_stale and not ModeRules.for_mode("async_naive").rolls_forward
    assert ModeRules.for_mode("async_rollforward").rolls_forward
