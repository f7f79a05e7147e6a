"""EdgeNode timing contract on the virtual clock: exact ticks, indices, delays and states.

Conventions used below (30 fps): 200 ms of simulated latency = 6 ticks, 100 ms = 3.
EncodingPolicy's action i of call c is CODE*c + i on every joint, so ``decode`` tells
which chunk (call) and index every executed action came from.
"""

import threading
import time
from itertools import pairwise

import numpy as np
import pytest

from robot_rl.core.clock import VirtualClock, WallClock
from robot_rl.edge import EdgeConfig, EdgeNode, PolicyRunner, VirtualLatencyRunner, at_tick
from robot_rl.edge.inference import InferenceRequest, PolicySwap, ThreadedRunner
from tests.edge_fakes import (
    CountingTask,
    EncodingPolicy,
    FaultyPolicy,
    KinematicRobot,
    ScriptedLatency,
    SlowPolicy,
    TorchEncodingPolicy,
    decode,
)


def make_node(mode="async_naive", latency_ms=200.0, policy=None, latencies=None, **cfg):
    """A node on the virtual clock. Tick 0 asks for the first chunk like any other tick
    (``plan_before_start`` off) unless a test turns it on: the contract is easiest to
    read when every chunk, the first included, is requested and spliced on a tick."""
    robot = KinematicRobot()
    policy = policy or EncodingPolicy(chunk_size=20)
    cfg.setdefault("plan_before_start", False)
    config = EdgeConfig(mode=mode, simulated_latency_ms=latency_ms, **cfg)
    worker = None
    if latencies is not None:
        worker = VirtualLatencyRunner(PolicyRunner(policy, 0, 6), ScriptedLatency(latencies),
                                      config.effective_max_inflight)
    node = EdgeNode(robot, policy, VirtualClock(), config, worker=worker)
    return node, robot, policy


def run(node, ticks):
    return [node.tick() for _ in range(ticks)]


def executed(steps):
    """(tick, call, index) of each step that executed a policy action."""
    return [(s.tick, *decode(s.action)) for s in steps if s.chunk_id >= 0]


# ----------------------------------------------------------------------------- request and splice


def test_first_chunk_waits_then_runs_from_index_zero():
    node, robot, _ = make_node(latency_ms=200.0, request_threshold=8)
    steps = run(node, 10)
    assert [s.chunk_id for s in steps[:6]] == [-1] * 6  # waiting for the first chunk
    assert not any(s.stall for s in steps[:6]) and node.stats.wait_ticks == 6
    assert [decode(s.action) for s in steps[6:]] == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert steps[6].chunk_index == 0 and steps[6].policy_version == 0


@pytest.mark.parametrize("mode", ["sync", "async_naive", "async_rollforward"])
def test_plan_before_start_computes_the_first_chunk_with_the_arm_at_rest(mode):
    node, robot, _ = make_node(mode=mode, latency_ms=400.0, plan_before_start=True)
    steps = run(node, 3)
    assert [decode(s.action) for s in steps] == [(0, 0), (0, 1), (0, 2)]  # moving from tick 0
    assert node.stats.wait_ticks == 0 and not any(s.stall for s in steps)
    assert steps[0].time_s == pytest.approx(0.4)  # the episode's clock starts when the plan is there
    assert [s.time_s - steps[0].time_s for s in steps] == pytest.approx([0.0, 1 / 30, 2 / 30])
    assert len(robot.sent) == 3  # nothing was sent while it waited
    assert list(node.stats.measured_delays) == [12]  # 400 ms = 12 ticks: a real measurement seeds the estimator
    assert node.delay.estimate() == 12


def test_plan_before_start_gives_up_after_the_timeout_and_the_chunk_lands_late():
    node, _, _ = make_node(mode="async_rollforward", latency_ms=400.0, plan_before_start=True,
                           first_chunk_timeout_s=0.1)
    steps = run(node, 12)
    assert steps[0].time_s == pytest.approx(0.1, abs=0.006)  # waited 0.1 s (polls every 5 ms), then started
    assert [s.chunk_id for s in steps[:9]] == [-1] * 9  # holding until the chunk arrives (0.4 s after asking)
    assert steps[9].chunk_id == 0 and steps[9].chunk_index == 0


def test_plan_before_start_waits_out_an_answer_to_the_previous_episode():
    node, _, _ = make_node(mode="async_rollforward", latency_ms=300.0, plan_before_start=True)
    node.run_episode(30)  # the last request (from tick ~18) is still in flight when it ends
    assert node.worker.busy
    old = node.stats.chunks[-1].chunk_id
    second = node.run_episode(3)
    assert {s.chunk_id for s in second.steps} == {old + 1}  # its own first chunk, from tick 0
    assert [s.chunk_index for s in second.steps] == [0, 1, 2]


def test_a_human_driving_at_tick_zero_is_not_kept_waiting():
    node, _, _ = make_node(mode="async_rollforward", latency_ms=400.0, plan_before_start=True)
    node.intervention = lambda obs: np.full(6, 5.0, dtype=np.float32)
    step = node.tick()
    assert step.time_s == pytest.approx(0.0) and step.is_intervention

def test_request_when_remaining_reaches_threshold_and_notes_k():
    node, _, _ = make_node(latency_ms=200.0, request_threshold=8)
    run(node, 20)
    first, second = list(node.stats.chunks)[:2]
    assert first.request_tick == 0 and first.executed_index == -1
    # chunk 0 runs from tick 6; at the start of tick 18 it has 20 - 12 = 8 actions left
    assert second.request_tick == 18
    assert second.remaining_at_request == 8
    assert second.executed_index == 11  # chunk 0 index executed at tick 17


def test_naive_drops_first_d_prime_actions_and_executes_chunk_at_d_prime():
    node, _, policy = make_node(latency_ms=200.0, request_threshold=8)
    steps = run(node, 30)
    record = node.stats.chunks[1]
    assert record.arrival_tick == 24 and record.measured_delay == 6
    assert record.stale_dropped == 6
    by_tick = {t: (c, i) for t, c, i in executed(steps)}
    assert [by_tick[t] for t in range(18, 24)] == [(0, i) for i in range(12, 18)]  # old chunk keeps running
    assert by_tick[24] == (1, 6)  # exactly chunk[d']
    assert by_tick[25] == (1, 7)
    # naive mode gives the policy the measured state: the target executed at tick 17
    assert np.array_equal(policy.states[1], np.full(6, 11.0, np.float32))


def test_rollforward_state_is_chunk_at_k_plus_d_and_on_time_chunk_starts_at_zero():
    node, _, policy = make_node("async_rollforward", latency_ms=200.0, request_threshold=8)
    steps = run(node, 30)
    record = node.stats.chunks[1]
    k, d = record.executed_index, record.delay_used
    assert (record.request_tick, k, d) == (18, 11, 6)  # d learnt from the first inference
    assert np.array_equal(policy.states[1], np.full(6, k + d, np.float32))  # chunk 0 action k+d
    assert np.array_equal(record.policy_state, policy.states[1])
    assert record.measured_delay == 6 and record.stale_dropped == 0 and record.old_kept == 0
    by_tick = {t: (c, i) for t, c, i in executed(steps)}
    assert by_tick[23] == (0, k + d)  # the state the policy was told about...
    assert by_tick[24] == (1, 0)  # ...is exactly where the new chunk starts
    seam = steps[24]
    assert seam.delay_ticks == 6 and np.array_equal(seam.rolled_state, policy.states[1])


def test_rollforward_with_a_command_lag_gives_the_state_the_arm_will_be_read_at():
    """The arm reads 2 ticks behind its commands: the rolled state is the target commanded 2 ticks
    before the new chunk starts (chunk 0 action k+d-2), the new chunk still starts at k+d."""
    node, _, policy = make_node("async_rollforward", latency_ms=200.0, request_threshold=8, command_lag_ticks=2)
    steps = run(node, 30)
    record = node.stats.chunks[1]
    k, d = record.executed_index, record.delay_used
    assert np.array_equal(policy.states[1], np.full(6, k + d - 2, np.float32))
    assert {t: (c, i) for t, c, i in executed(steps)}[24] == (1, 0)


def test_rollforward_late_chunk_drops_only_the_extra_delay():
    # first inference 6 ticks (d becomes 6), second 9 ticks: 3 ticks later than planned
    node, _, _ = make_node("async_rollforward", latencies=[200.0, 300.0], request_threshold=10)
    steps = run(node, 30)
    record = node.stats.chunks[1]
    assert (record.request_tick, record.executed_index, record.delay_used) == (16, 9, 6)
    assert record.arrival_tick == 25 and record.measured_delay == 9
    assert record.stale_dropped == 3
    by_tick = {t: (c, i) for t, c, i in executed(steps)}
    assert by_tick[24] == (0, 18)
    assert by_tick[25] == (1, 3)
    assert node.stats.stall_ticks == 0


def test_rollforward_early_chunk_waits_for_its_start_tick():
    # second inference takes 3 ticks although d = 6 was planned for
    node, _, _ = make_node("async_rollforward", latencies=[200.0, 100.0], request_threshold=10)
    steps = run(node, 30)
    record = node.stats.chunks[1]
    assert record.arrival_tick == 19 and record.old_kept == 3 and record.stale_dropped == 0
    by_tick = {t: (c, i) for t, c, i in executed(steps)}
    assert [by_tick[t] for t in range(16, 22)] == [(0, i) for i in range(10, 16)]  # through k+d = 15
    assert by_tick[22] == (1, 0)


def test_adaptive_threshold_is_delay_estimate_plus_margin():
    node, _, _ = make_node("async_rollforward", latency_ms=200.0, threshold_margin=2, replan="thrifty")
    run(node, 100)
    later = list(node.stats.chunks)[1:]
    assert later, "expected several inferences"
    for record in later:
        assert record.delay_estimate == 6
        assert record.remaining_at_request == 6 + 2  # asked at the first tick it was allowed to
    assert node.stats.stall_ticks == 0


def test_min_request_threshold_re_plans_a_fast_policy_before_its_chunk_runs_out():
    # 0 ms inference: the adaptive threshold alone is 0 + 2, so a 20-action chunk runs 18
    # ticks open loop; a floor of 10 asks again after 10 actions.
    node, _, _ = make_node("async_rollforward", latency_ms=0.0, threshold_margin=2, delay_prior_ticks=0,
                           min_request_threshold=10)
    run(node, 60)
    later = list(node.stats.chunks)[1:]
    assert later, "expected several inferences"
    assert all(record.remaining_at_request == 10 for record in later)
    assert node.stats.stall_ticks == 0


def test_min_request_threshold_does_not_hold_back_a_slow_policy():
    # 400 ms = 12 ticks: delay + margin (14) is above the floor, so the floor changes nothing.
    node, _, _ = make_node("async_rollforward", latency_ms=400.0, threshold_margin=2, min_request_threshold=10)
    run(node, 100)
    later = list(node.stats.chunks)[1:]
    assert later and all(record.remaining_at_request == 14 for record in later)
    assert node.stats.stall_ticks == 0


def test_negative_min_request_threshold_is_refused():
    with pytest.raises(ValueError, match="min_request_threshold"):
        EdgeConfig(min_request_threshold=-1)


# ----------------------------------------------------------------------------- watchdog and safety


def test_empty_queue_holds_last_command_and_counts_stalls():
    node, robot, _ = make_node(latency_ms=200.0, request_threshold=0)
    steps = run(node, 34)
    # chunk 0 runs ticks 6..25; the next request only happens at tick 26 with an empty queue
    stalls = [s.tick for s in steps if s.stall]
    assert stalls == list(range(26, 32))
    assert node.stats.stall_ticks == 6 and node.stats.wait_ticks == 6
    for s in steps[26:32]:
        assert np.array_equal(s.action, np.full(6, 19.0)) and s.chunk_id == -1 and s.policy_action is None
    # the robot stood still, so nothing of the new chunk is stale: it starts at index 0
    assert decode(steps[32].action) == (1, 0)


@pytest.mark.parametrize("fault", ["nan", "shape", "raise"])
def test_invalid_chunk_is_rejected_never_sent_and_the_plan_continues(fault):
    policy = FaultyPolicy({1: fault}, chunk_size=20)
    node, robot, _ = make_node(latency_ms=100.0, request_threshold=8, policy=policy)
    steps = run(node, 30)
    # chunk 0 runs from tick 3; chunk 1 is asked for at tick 15 and comes back bad at tick 18
    bad, retry = node.stats.chunks[1], node.stats.chunks[2]
    assert (bad.request_tick, bad.arrival_tick, bad.queued) == (15, 18, 0)
    assert {"nan": "NaN", "shape": "shape (20, 5)", "raise": "raised RuntimeError"}[fault] in bad.error
    assert node.stats.chunks_rejected == 1
    assert all(np.isfinite(a).all() and a.shape == (6,) for a in robot.sent)
    assert all(s.chunk_id != bad.chunk_id for s in steps)
    by_tick = {t: (c, i) for t, c, i in executed(steps)}
    assert [by_tick[t] for t in range(15, 21)] == [(0, i) for i in range(12, 18)]  # old chunk kept running
    assert retry.request_tick == 18 and by_tick[21] == (2, 3)  # retried at once, spliced normally
    assert node.stats.stall_ticks == 0


def test_joint_delta_clamp_bounds_every_executed_step():
    node, robot, _ = make_node(latency_ms=100.0, max_joint_delta_per_tick=2.5)
    run(node, 80)  # chunk 1 jumps from ~20 to 1000+: the clamp must smooth it
    trajectory = np.stack([np.zeros(6, np.float32)] + robot.sent)
    assert np.abs(np.diff(trajectory, axis=0)).max() <= 2.5 + 1e-4
    assert trajectory[-1, 0] > 100  # and it still moves towards the targets


# ----------------------------------------------------------------------------- modes


def test_sync_loses_latency_ticks_per_chunk_while_async_loses_none():
    sync, _, _ = make_node("sync", latency_ms=200.0)
    sync_steps = run(sync, 120)
    # 6 waiting ticks, 20 actions, 6 waiting ticks, 20 actions, ...
    assert sync.stats.wait_ticks == 6 * 5 and sync.stats.stall_ticks == 0
    waits = [s.tick for s in sync_steps if s.chunk_id < 0]
    assert waits == [t for start in (0, 26, 52, 78, 104) for t in range(start, start + 6)]
    assert all(decode(s.action)[1] == (s.tick - 6) % 26 for s in sync_steps if s.chunk_id >= 0)

    for mode in ("async_naive", "async_rollforward"):
        node, _, _ = make_node(mode, latency_ms=200.0)
        steps = run(node, 120)
        assert node.stats.wait_ticks == 6  # only the very first chunk
        assert node.stats.stall_ticks == 0
        assert all(s.chunk_id >= 0 for s in steps[6:])


def test_sync_executes_its_execution_horizon_then_waits_with_measured_state():
    node, _, policy = make_node("sync", latency_ms=100.0, execution_horizon=8)
    steps = run(node, 3 + 8 + 3 + 8)
    assert [decode(s.action) for s in steps[3:11]] == [(0, i) for i in range(8)]
    assert [s.chunk_id for s in steps[11:14]] == [-1, -1, -1]
    assert decode(steps[14].action) == (1, 0)  # nothing dropped in sync mode
    assert np.array_equal(policy.states[1], np.full(6, 7.0, np.float32))  # where the arm stands


# ----------------------------------------------------------------------------- weights, humans, episodes


def test_weight_swap_applies_between_chunks_and_every_step_carries_its_version():
    node, _, policy = make_node("async_rollforward", latency_ms=100.0)
    node.on_tick = at_tick(10, lambda n: n.request_policy_swap({"base": 50000.0}, version=7))
    steps = run(node, 60)
    assert node.stats.swaps == 1
    swapped = next(r for r in node.stats.chunks if r.policy_version == 7)
    assert swapped.request_tick > 10  # the swap waited for the next request
    for s in steps:
        if s.chunk_id >= 0:
            expected = 7 if s.chunk_id >= swapped.chunk_id else 0
            assert s.policy_version == expected
            base = 50000.0 if expected == 7 else 0.0
            assert decode(s.action, base)[1] == s.chunk_index
    changes = [b for a, b in pairwise(steps) if a.policy_version != b.policy_version]
    assert changes and all(s.chunk_index >= 0 and s.chunk_id == swapped.chunk_id for s in changes)


def test_a_swap_carried_by_the_last_request_of_an_episode_is_counted_though_its_chunk_is_dropped():
    """The request that takes the swap may be in flight when the episode ends: its chunk belongs to
    the old episode and is dropped, but the weights are in, and the node says so (swaps, version)."""
    node, _, _ = make_node("async_rollforward", latency_ms=100.0)
    node.on_tick = at_tick(38, lambda n: n.request_policy_swap({"base": 50000.0}, version=7))
    node.run_episode(40, "go")
    node.on_tick = None
    later = node.run_episode(40, "go")
    assert node.stats.swaps == 1 and later.steps[-1].policy_version == 7


def test_swap_in_a_whole_policy_object():
    node, _, _ = make_node(latency_ms=0.0)
    node.request_policy_swap(EncodingPolicy(chunk_size=20, base=90000.0), version=2)
    step = node.tick()
    assert step.policy_version == 2 and decode(step.action, 90000.0) == (0, 0)
    with pytest.raises(TypeError):
        node.request_policy_swap(42, version=3)


def test_a_pending_swap_can_be_withdrawn_until_the_worker_takes_it():
    node, _, policy = make_node(latency_ms=0.0)
    first, second = EncodingPolicy(chunk_size=20, base=90000.0), EncodingPolicy(chunk_size=20, base=80000.0)
    node.request_policy_swap(first, version=2)
    assert not node.withdraw_policy_swap(second)  # only the policy that is pending
    assert node.withdraw_policy_swap(first) and not node.withdraw_policy_swap(first)
    step = node.tick()
    assert step.policy_version == 0 and node.running_policy is policy  # it never ran
    node.request_policy_swap(second, version=3)
    versions = [node.tick().policy_version for _ in range(40)]  # two chunks: the next request takes it
    assert versions[-1] == 3 and node.running_policy is second
    assert not node.withdraw_policy_swap(second)  # taken: too late


def test_intervention_overrides_the_policy_and_records_its_shadow_action():
    human_action = np.full(6, -5.0, np.float32)
    node, robot, _ = make_node(latency_ms=0.0)
    node.intervention = lambda obs: human_action if 10 <= node.tick_index < 15 else None
    steps = run(node, 20)
    for s in steps[10:15]:
        assert s.is_intervention and np.array_equal(s.action, human_action)
        assert s.policy_action is not None and s.chunk_id == -1
    assert not any(s.is_intervention for s in steps[:10] + steps[15:])
    assert node.stats.intervention_ticks == 5


def test_run_episode_with_task_hooks_and_sink():
    robot = KinematicRobot()
    task = CountingTask(success_tick=40)
    seen_ticks, sunk = [], []
    node = EdgeNode(
        robot, EncodingPolicy(), VirtualClock(), EdgeConfig(simulated_latency_ms=150.0), task=task,
        on_tick=lambda n, t: seen_ticks.append(t), step_sink=sunk.append,
    )
    episode = node.run_episode(200, "pick up the red cube", episode_id=3, seed=11)
    assert episode.num_steps == 41 and episode.success and episode.steps[-1].done
    assert not any(s.done for s in episode.steps[:-1])
    assert seen_ticks == list(range(41)) and sunk == episode.steps
    assert episode.steps[0].instruction == "pick up the red cube" and episode.seed == 11
    # The first chunk (150 ms) is computed before tick 0, then ticks run at exactly 30 Hz.
    assert all(s.time_s == pytest.approx(0.15 + s.tick / 30) for s in episode.steps)
    assert episode.steps[0].chunk_id == 0 and episode.steps[0].chunk_index == 0
    node.task = None
    cut = node.run_episode(5, "again")
    assert cut.num_steps == 5 and cut.steps[-1].done and cut.steps[0].tick == 0


def test_a_task_oracle_judges_each_step_and_a_robot_without_one_leaves_its_episode_unjudged():
    robot = KinematicRobot()
    node = EdgeNode(robot, EncodingPolicy(), VirtualClock(), EdgeConfig(simulated_latency_ms=0.0),
                    task=CountingTask(success_tick=5))
    judged = node.run_episode(20, "push")
    assert {(s.success_source, s.success_confidence) for s in judged.steps} == {("task", 1.0)}
    node.task = None  # a real arm: nobody says whether it succeeded
    alone = node.run_episode(5, "push")
    assert {(s.success_source, s.success_confidence) for s in alone.steps} == {("", 0.0)}
    assert not alone.success


def test_answers_to_a_previous_episode_are_never_executed():
    node, _, _ = make_node(latency_ms=300.0)
    first = node.run_episode(20)  # chunk 1 is asked for at tick 18 and still in flight at the end
    assert node.worker.busy
    in_flight = node.stats.chunks[-1].chunk_id
    second = node.run_episode(40)
    assert in_flight not in {s.chunk_id for s in second.steps}
    assert any(s.chunk_id > in_flight for s in second.steps)
    assert second.steps[0].time_s == pytest.approx(first.steps[-1].time_s + 1 / 30)


# ----------------------------------------------------------------------------- requests in flight together


def test_two_requests_in_flight_are_staggered_half_an_inference_apart():
    # Continuous re-planning: 200 ms = 6 ticks; with two in flight a new request starts every
    # ceil(6 / 2) = 3 ticks once the delay is known.
    node, _, _ = make_node("async_rollforward", latency_ms=200.0, replan="continuous", max_inflight=2,
                           delay_prior_ticks=6)
    run(node, 30)
    ticks = [c.request_tick for c in node.stats.chunks]
    assert ticks[:6] == [0, 3, 6, 9, 12, 15]
    arrivals = [c.arrival_tick for c in list(node.stats.chunks)[:6]]
    assert arrivals == [6, 9, 12, 15, 18, 21]  # each one inference (6 ticks) after its request
    assert node.worker.in_flight <= 2 and node.stats.stall_ticks == 0


@pytest.mark.parametrize("latency_ms, distribution, compute_s, slots", [
    (200.0, "constant", 0.0, 2),     # a simulated remote server: two staggered slots
    (0.0, "constant", 0.0, 0),       # a local policy computing at once: it would re-plan every tick
    (0.0, "measured", 0.012, 1),     # 12 ms of real compute per tick of 33: one slot (two: 73 %)
    (0.0, "measured", 0.03, 0),      # computing through most of every tick: thrifty
])
def test_auto_replans_continuously_where_the_policy_affords_it(latency_ms, distribution, compute_s, slots):
    """edge.replan=auto: slots x device time within replan_duty (0.5) of the latency (at least a tick)."""
    policy = SlowPolicy(compute_s, chunk_size=20) if compute_s else EncodingPolicy(chunk_size=20)
    node, _, _ = make_node("async_rollforward", latency_ms=latency_ms, policy=policy, delay_prior_ticks=3,
                           latency_distribution=distribution)
    assert node.stats.replan_slots == 0  # nothing measured yet: thrifty
    run(node, 40)
    assert node.stats.replan_slots == slots
    later = list(node.stats.chunks)[3:]
    gaps = {b.request_tick - a.request_tick for a, b in pairwise(later)}
    if slots:  # a request as soon as a slot is free, staggered over one inference
        inference = max(1, -(-int(latency_ms) * 30 // 1000))
        assert gaps == {max(1, -(-inference // slots))}
    else:  # one request per chunk: when delay + margin actions remain
        assert all(r.remaining_at_request == r.delay_estimate + 2 for r in later)


def test_one_in_flight_waits_for_the_running_inference():
    node, _, _ = make_node("async_rollforward", latency_ms=200.0, replan="continuous", max_inflight=1,
                           delay_prior_ticks=6)
    run(node, 30)
    assert [c.request_tick for c in node.stats.chunks][:4] == [0, 6, 12, 18]


def test_an_answer_overtaken_by_a_newer_one_is_never_executed():
    # Chunk 0 takes 9 ticks, chunk 1 (requested 3 ticks later) only 3: chunk 1 lands first
    # and chunk 0, planned from an older image, is dropped as superseded.
    node, _, _ = make_node("async_rollforward", replan="continuous", max_inflight=2, delay_prior_ticks=6,
                           latencies=[300.0, 100.0])
    steps = run(node, 20)
    assert node.stats.chunks_superseded == 1
    calls = {decode(s.action)[0] for s in steps if s.chunk_id >= 0}
    assert 0 not in calls and 1 in calls


def test_sync_never_has_more_than_one_request_in_flight():
    node, _, _ = make_node("sync", latency_ms=200.0, max_inflight=3)
    run(node, 40)
    assert node.worker.max_inflight == 1
    ticks = [c.request_tick for c in node.stats.chunks]
    assert all(b - a >= 6 for a, b in zip(ticks, ticks[1:], strict=False))


def test_policy_for_another_robot_is_refused():
    with pytest.raises(ValueError, match="joints"):
        EdgeNode(KinematicRobot(num_joints=6), EncodingPolicy(action_dim=7), VirtualClock())


def test_threaded_runner_on_the_wall_clock_delivers_and_splices_chunks():
    robot = KinematicRobot(fps=50)
    policy = SlowPolicy(0.02, chunk_size=10)
    with EdgeNode(robot, policy, WallClock(), EdgeConfig(fps=50, mode="async_rollforward")) as node:
        episode = node.run_episode(30)
    assert node.stats.chunks_spliced >= 2
    assert any(s.chunk_id >= 0 for s in episode.steps)
    assert all(np.isfinite(a).all() for a in robot.sent)


class MeetingPolicy(EncodingPolicy):
    """Each prediction waits (bounded) for a second one to run at the same time."""

    def __init__(self):
        super().__init__(chunk_size=10)
        self.barrier = threading.Barrier(2)
        self.met = 0

    def predict_chunk(self, observation, state, instruction):
        try:
            self.barrier.wait(timeout=2.0)
            self.met += 1
        except threading.BrokenBarrierError:
            self.barrier.reset()
        return super().predict_chunk(observation, state, instruction)


def test_threaded_runner_computes_requests_in_flight_together():
    policy = MeetingPolicy()
    runner = ThreadedRunner(PolicyRunner(policy, 0, 6), WallClock().now, max_inflight=2)
    try:
        requests = [InferenceRequest(chunk_id=i, request_tick=0, request_time_s=0.0, images={},
                                     state=np.zeros(6, np.float32), instruction="", executed_index=-1, delay_ticks=0,
                                     delay_estimate=0, start_tick=None, rolled_state=None, generation=0)
                    for i in range(2)]
        for request in requests:
            runner.submit(request)
        with pytest.raises(RuntimeError, match="in flight"):
            runner.submit(requests[0])
        results = []
        while len(results) < 2:
            result = runner.poll(0.0)
            if result is not None:
                results.append(result)
        assert policy.met == 2  # both predictions were running at the same moment
        assert all(r.chunk is not None for r in results) and runner.in_flight == 0
    finally:
        runner.close()


def test_a_swap_waits_until_no_prediction_is_running():
    runner = PolicyRunner(EncodingPolicy(chunk_size=4), 0, 6)
    with runner._gate.predicting():
        swapped = threading.Event()

        def swap():
            with runner._gate.swapping():
                swapped.set()

        thread = threading.Thread(target=swap)
        thread.start()
        assert not swapped.wait(timeout=0.2)  # blocked while the prediction runs
    thread.join(timeout=5.0)
    assert swapped.is_set()


class FirstCallWaits(EncodingPolicy):
    """EncodingPolicy whose first prediction runs until the test lets it finish."""

    def __init__(self) -> None:
        super().__init__(chunk_size=4)
        self.first_started, self.finish_first = threading.Event(), threading.Event()
        self._first_lock = threading.Lock()

    def predict_chunk(self, observation, state, instruction):
        with self._first_lock:
            first = not self.first_started.is_set()
            self.first_started.set()
        if first:
            assert self.finish_first.wait(timeout=10.0)
        return super().predict_chunk(observation, state, instruction)


def test_a_chunk_requested_after_a_swap_is_computed_with_the_new_weights_whatever_thread_takes_it():
    policy = FirstCallWaits()
    runner = ThreadedRunner(PolicyRunner(policy, 0, 6), WallClock().now, max_inflight=3)

    def request(chunk_id: int, swap: PolicySwap | None = None) -> InferenceRequest:
        return InferenceRequest(chunk_id=chunk_id, request_tick=0, request_time_s=0.0, images={},
                                state=np.zeros(6, np.float32), instruction="", executed_index=-1, delay_ticks=0,
                                delay_estimate=0, start_tick=None, rolled_state=None, generation=0, swap=swap)

    try:
        runner.submit(request(0))
        assert policy.first_started.wait(timeout=5.0)  # chunk 0 runs; the swap below must wait for it
        runner.submit(request(1, PolicySwap(version=1, state_dict={"base": 1000.0})))
        runner.submit(request(2))  # a third thread is free to take it at once
        results = {}
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:  # chunk 2 must not be computed before the swap
            result = runner.poll(0.0)
            if result is not None:
                results[result.request.chunk_id] = result
        policy.finish_first.set()
        deadline = time.monotonic() + 10.0
        while len(results) < 3 and time.monotonic() < deadline:
            result = runner.poll(0.0)
            if result is not None:
                results[result.request.chunk_id] = result
        assert {chunk: r.policy_version for chunk, r in results.items()} == {0: 0, 1: 1, 2: 1}
        assert results[2].chunk is not None and results[2].chunk.actions[0, 0] >= 1000.0
    finally:
        policy.finish_first.set()
        runner.close()


def test_announcing_a_swap_never_waits_for_one_being_applied():
    runner = PolicyRunner(EncodingPolicy(chunk_size=4), 0, 6)
    with runner._gate.swapping():  # a swap's load holds the gate
        announced = threading.Event()
        thread = threading.Thread(target=lambda: (runner.announce_swap(), announced.set()))
        thread.start()
        assert announced.wait(timeout=2.0)  # the control thread's submit goes on meanwhile
    thread.join(timeout=5.0)


def test_failing_teleop_holds_and_failing_sink_does_not_stop_the_robot():
    node, robot, _ = make_node(latency_ms=0.0)
    run(node, 5)

    def broken_teleop(obs):
        raise OSError("gamepad unplugged")

    def broken_sink(step):
        raise OSError("disk full")

    node.intervention, node.step_sink = broken_teleop, broken_sink
    before = robot.sent[-1].copy()
    steps = run(node, 3)
    assert all(np.array_equal(s.action, before) for s in steps)  # held, not handed back to the policy
    assert node.stats.invalid_human_actions == 3 and node.stats.sink_errors == 3


def test_a_sink_that_blocks_in_wall_time_leaves_the_virtual_schedule_exact():
    """Virtual time is the only time the node reads: a step sink that sleeps (a disk, a full
    link) changes neither when ticks happen nor when chunks land nor what executes."""
    import time

    reference, _, _ = make_node("async_rollforward", latency_ms=150.0)
    expected = run(reference, 45)
    node, _, _ = make_node("async_rollforward", latency_ms=150.0)
    node.step_sink = lambda step: time.sleep(0.01)  # 10 ms of wall time per tick
    steps = run(node, 45)
    assert [s.time_s for s in steps] == [s.time_s for s in expected]
    assert executed(steps) == executed(expected)
    assert [r.arrival_tick for r in node.stats.chunks] == [r.arrival_tick for r in reference.stats.chunks]



def test_a_swap_whose_answer_comes_after_its_episode_ended_is_settled_so_the_shadow_is_free_again():
    """The previous episode's last answer is dropped when the next one starts; the swap it carried must
    still be settled, or the shadow stays taken for good and the robot never loads newer weights."""
    node = EdgeNode(KinematicRobot(), TorchEncodingPolicy(), VirtualClock(),
                    EdgeConfig(fps=30, simulated_latency_ms=600.0))
    node.on_tick = at_tick(1, lambda n: n.request_policy_swap(n.swaps.free_shadow(), version=7))
    node.run_episode(12, "go")  # its request with v7 is answered 18 ticks later, after the episode's end
    assert node.swaps.free_shadow() is None  # taken, answer still in flight
    node.on_tick = None
    node.run_episode(30, "go")  # the start drops that answer
    assert node.swaps.free_shadow() is not None
