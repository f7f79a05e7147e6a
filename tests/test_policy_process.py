"""A policy in a process of its own (robot_rl.edge.process_runner): chunks, swaps, failures, and a
control loop that a weights load holding the interpreter lock cannot delay.

Wall-clock episodes here are short (a second or two). How late a tick gets beside a slow load is
the machine's: the comparison of the same load in a thread of the control process against the
policy's process runs under the ``long`` marker, and `robot-rl bench realtime` measures both runners
beside a training learner.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from robot_rl.bridges.zmq.weights import serialize_tensors
from robot_rl.core.clock import WallClock
from robot_rl.edge import EdgeConfig, EdgeNode
from robot_rl.edge.process_runner import PolicyProcessError, ProcessRunner, spawn_policy
from robot_rl.edge.weight_loading import load_weights_into
from tests.edge_fakes import KinematicRobot, TorchEncodingPolicy, failing_policy

OBS = {"front": np.zeros((4, 4, 3), dtype=np.uint8)}
STATE = np.zeros(6, dtype=np.float32)
PERIOD_S = 1 / 30


@pytest.fixture
def process_policy():
    policy = spawn_policy(functools.partial(TorchEncodingPolicy, base=5.0))
    yield policy
    policy.close()


def versions_of(episode) -> list[int]:
    return [s.policy_version for s in episode.steps]


def weights(base: float) -> bytes:
    return serialize_tensors({"base": torch.tensor(base)})


def test_the_child_builds_the_policy_and_answers_like_it(process_policy):
    here = TorchEncodingPolicy(base=5.0)
    assert (process_policy.action_dim, process_policy.chunk_size, process_policy.swappable) == (6, 20, True)
    assert np.array_equal(process_policy.predict_chunk(OBS, STATE, "go"), here.predict_chunk(OBS, STATE, "go"))
    node = EdgeNode(KinematicRobot(), process_policy, WallClock(), EdgeConfig(fps=30))
    assert isinstance(node.worker, ProcessRunner)
    episode = node.run_episode(30, "go")
    # Every executed action came from a chunk of the child (5 + chunk index), none from a hold.
    assert all(s.chunk_id >= 0 and s.action[0] == 5.0 + s.chunk_index for s in episode.steps)
    assert node.stats.chunks_spliced >= 2 and node.stats.chunks_rejected == 0


def test_staged_weights_are_swapped_in_between_chunks_and_bad_ones_refused(process_policy, tmp_path):
    node = EdgeNode(KinematicRobot(), process_policy, WallClock(), EdgeConfig(fps=30))
    runner = node.worker
    node.run_episode(10, "go")
    buffer = process_policy.allocate_weights(len(weights(100.0)))
    buffer[:] = weights(100.0)
    process_policy.stage_weights(1, buffer)
    [shared] = [Path(p) for p in process_policy._weights_files._staged]
    episode = node.run_episode(90, "go")
    assert 1 in runner.loaded_at and versions_of(episode)[-1] == 1 and node.stats.swaps == 1
    process_policy.stage_weights(2, serialize_tensors({"other": torch.zeros(3)}))  # does not fit: refused
    later = node.run_episode(30, "go")
    assert [v for v, _ in runner.weights_errors] == [2] and set(versions_of(later)) == {1}
    assert node.stats.swaps == 1 and node.stats.swap_failures == 0
    new = [s for s in episode.steps if s.policy_version == 1 and s.chunk_id >= 0]
    assert new and all(s.action[0] == 100.0 + s.chunk_index for s in new)
    # A chunk is computed by one version whole: the version changes only where a new chunk starts.
    steps = episode.steps
    changes = [b for a, b in zip(steps, steps[1:], strict=False) if a.policy_version != b.policy_version]
    assert all(s.chunk_index == 0 or s.chunk_id == -1 for s in changes)
    # The child released the file it loaded: the next download of that size is assembled in it, and
    # closing the policy removes it.
    again = process_policy.allocate_weights(len(weights(100.0)))
    assert process_policy._weights_files.reused == 1 and process_policy._weights_files.stage(again) == shared
    process_policy.close()
    assert not shared.exists()


def test_the_first_weights_go_into_a_file_and_a_shadow_prepared_before_them(process_policy):
    node = EdgeNode(KinematicRobot(), process_policy, WallClock(), EdgeConfig(fps=30))
    process_policy.prepare_for_weights()  # what the streamer does when its link starts
    files = process_policy._weights_files
    deadline = time.monotonic() + 10
    while files.free == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    payload = weights(100.0)
    buffer = process_policy.allocate_weights(len(payload))
    assert files.reused == 1  # the prepared file: its pages are in already
    buffer[:] = payload
    process_policy.stage_weights(1, buffer)
    episode = node.run_episode(90, "go")
    assert versions_of(episode)[-1] == 1 and episode.steps[-1].action[0] >= 100.0


def test_the_child_builds_its_shadow_once_with_published_tensors_of_its_own():
    from robot_rl.edge.process_runner import _PolicyServer

    policy = TorchEncodingPolicy(base=5.0)
    server = _PolicyServer(policy, conn=None, version=0)
    shadow = server.swaps.prepare()
    assert shadow is not policy and shadow.base.data_ptr() != policy.base.data_ptr()
    assert float(shadow.base) == 5.0
    assert server.swaps.free_shadow() is shadow  # the loader asks again with the first weights: the same shadow


def test_newer_weights_win_over_ones_not_yet_loaded(process_policy):
    node = EdgeNode(KinematicRobot(), process_policy, WallClock(), EdgeConfig(fps=30))
    for version, base in ((1, 100.0), (2, 200.0), (3, 300.0)):
        process_policy.stage_weights(version, weights(base))
    episode = node.run_episode(60, "go")
    assert episode.steps[-1].policy_version == 3 and episode.steps[-1].action[0] >= 300.0


def test_a_call_made_after_a_load_ended_gets_its_own_answer_and_the_load_still_reaches_the_runner(process_policy):
    node = EdgeNode(KinematicRobot(), process_policy, WallClock(), EdgeConfig(fps=30))
    runner = node.worker
    node.run_episode(10, "go")  # the runner exists: the child loads weights from now on
    while runner.in_flight:
        runner.poll(0.0)
    process_policy.stage_weights(1, weights(100.0))
    deadline = time.monotonic() + 30
    while not process_policy.has_message() and time.monotonic() < deadline:  # the load's news came first
        time.sleep(0.01)
    assert process_policy.has_message()
    chunk = process_policy.predict_chunk(OBS, STATE, "go")
    assert chunk.shape == (20, 6) and 1 in runner.loaded_at


def test_a_factory_that_fails_is_one_clear_error():
    # A missing checkpoint stays a FileNotFoundError (the CLI reports those in one line), others say where.
    with pytest.raises(FileNotFoundError, match="no checkpoint at /nowhere"):
        spawn_policy(failing_policy)
    with pytest.raises(PolicyProcessError, match="could not be built.*RuntimeError: no GPU"):
        spawn_policy(functools.partial(failing_policy, RuntimeError("no GPU")))


def test_a_dead_policy_process_leaves_the_arm_holding(process_policy):
    robot = KinematicRobot()
    node = EdgeNode(robot, process_policy, WallClock(), EdgeConfig(fps=30))
    node.run_episode(10, "go")
    os.kill(process_policy._process.pid, 9)
    process_policy._process.join(5)
    episode = node.run_episode(30, "go")  # no exception: the control loop keeps its ticks
    assert node.worker.died is not None and "gone" in node.worker.died
    held = episode.steps[-1].action
    assert all(np.array_equal(s.action, held) for s in episode.steps[-10:])
    assert node.stats.chunks_rejected >= 1


def _max_lateness_while_loading(node: EdgeNode, load) -> float:
    """Run an episode on the wall clock, start a weights load mid-way, return the worst lateness."""
    node.run_episode(15, "go")  # warm: the first chunk and the clock
    node.stats.max_lateness_s = 0.0

    def hook(_node: EdgeNode, tick: int) -> None:
        if tick == 5:
            load()

    node.on_tick = hook
    node.run_episode(45, "go")
    return node.stats.max_lateness_s


def test_a_load_that_holds_the_interpreter_lock_runs_in_the_policy_process_while_the_episode_ticks():
    """The load (its state-dict walk holds the child's interpreter lock for 0.4 s) starts at tick 5; the
    episode runs all its ticks while the policy process loads, and later chunks come from the new weights."""
    remote = spawn_policy(functools.partial(TorchEncodingPolicy, load_hold_s=0.4))
    node = EdgeNode(KinematicRobot(), remote, WallClock(), EdgeConfig(fps=30, replan="thrifty"))
    try:
        node.run_episode(15, "go")
        node.on_tick = lambda _node, tick: remote.stage_weights(1, weights(50.0)) if tick == 5 else None
        episode = node.run_episode(45, "go")
        assert len(episode.steps) == 45  # every tick ran while the policy process loaded
        node.on_tick = None
        for _ in range(10):  # a loaded machine may finish the load after that episode: bounded, not timed
            later = node.run_episode(60, "go")
            if later.steps[-1].policy_version == 1:
                break
    finally:
        node.close()
    assert later.steps[-1].policy_version == 1 and later.steps[-1].action[0] >= 50.0
    assert node.stats.swaps == 1 and node.stats.swap_failures == 0


@pytest.mark.long
def test_a_load_that_holds_the_interpreter_lock_delays_no_tick_in_its_own_process():
    """The same load (its state-dict walk holds the GIL for 0.4 s) started at tick 5: in a thread
    of the control process it makes a tick that late; in the policy's process no tick is even a
    period late. The thread is the control experiment: it shows the load really blocks."""
    import threading

    hold_s = 0.4
    here = TorchEncodingPolicy(load_hold_s=hold_s)
    # One request per chunk in both arms (edge.replan): what differs is only where the load runs.
    node = EdgeNode(KinematicRobot(), here, WallClock(),
                    EdgeConfig(fps=30, inference_runner="thread", replan="thrifty"))
    shadow = TorchEncodingPolicy(load_hold_s=hold_s)
    loads = []

    def load_in_thread() -> None:
        thread = threading.Thread(target=lambda: (load_weights_into(shadow, weights(50.0)),
                                                  node.request_policy_swap(shadow, 1)))
        thread.start()
        loads.append(thread)

    in_thread = _max_lateness_while_loading(node, load_in_thread)
    loads[0].join()
    node.close()

    remote = spawn_policy(functools.partial(TorchEncodingPolicy, load_hold_s=hold_s))
    node = EdgeNode(KinematicRobot(), remote, WallClock(), EdgeConfig(fps=30, replan="thrifty"))
    in_process = _max_lateness_while_loading(node, lambda: remote.stage_weights(1, weights(50.0)))
    assert 1 in node.worker.loaded_at  # the slow load did happen, during the episode
    node.close()
    assert in_thread > hold_s / 2, f"the control experiment did not block ({in_thread * 1000:.0f} ms)"
    assert in_process < PERIOD_S, f"a tick was {in_process * 1000:.1f} ms late with the load in its own process"
