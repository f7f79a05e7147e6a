"""bench async's measuring functions: reaction detection, perturbation phases, ratios."""

import math

import numpy as np
import pytest

from robot_rl.bench.async_control import PERTURB_SPREAD_TICKS, add_ratios_to_sync, mode_config, perturb_tick
from robot_rl.bench.reaction import reaction_time
from robot_rl.edge import EdgeConfig


def twin_paths(diverge_at: int, step_m: float, direction, n: int = 40):
    """Baseline at the origin; the moved run leaves it at ``diverge_at`` by step_m per tick."""
    base = np.zeros((n, 3))
    moved = base.copy()
    unit = np.asarray(direction, float) / np.linalg.norm(direction)
    for t in range(diverge_at, n):
        moved[t] = unit * step_m * (t - diverge_at + 1)
    return moved, base


def test_reaction_is_the_first_tick_heading_for_the_new_target():
    moved, base = twin_paths(diverge_at=14, step_m=0.004, direction=[0.0, 1.0, 0.0])
    r = reaction_time(moved, base, np.array([0.0, 0.1, 0.0]), perturb_tick=10, fps=30)
    assert r.reaction_tick == 14
    assert r.reaction_s == pytest.approx(5 / 30)  # ticks 10..14 inclusive


def test_moving_away_from_the_new_target_is_not_a_reaction():
    moved, base = twin_paths(diverge_at=12, step_m=0.004, direction=[0.0, -1.0, 0.0])
    r = reaction_time(moved, base, np.array([0.0, 0.1, 0.0]), perturb_tick=10, fps=30)
    assert r.reaction_tick is None and math.isnan(r.reaction_s)


def test_a_target_that_did_not_move_is_an_error():
    moved, base = twin_paths(diverge_at=12, step_m=0.004, direction=[1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="did not move"):
        reaction_time(moved, base, np.zeros(3), perturb_tick=10, fps=30)


def test_perturbations_cover_every_phase_of_one_inference():
    ticks = [perturb_tick(i) for i in range(PERTURB_SPREAD_TICKS)]
    assert sorted(t - ticks[0] for t in ticks) == list(range(PERTURB_SPREAD_TICKS))


def test_variants_replan_continuously_with_two_in_flight_or_thriftily_with_one():
    config = mode_config(EdgeConfig(max_inflight=1), "async_rollforward_pipelined", 200)
    assert (config.mode, config.replan, config.effective_max_inflight) == ("async_rollforward", "continuous", 2)
    assert config.simulated_latency_ms == 200.0 and config.inference_runner == "virtual"
    thrifty = mode_config(EdgeConfig(), "async_rollforward_thrifty", 200)
    assert (thrifty.mode, thrifty.replan, thrifty.effective_max_inflight) == ("async_rollforward", "thrifty", 1)
    plain = mode_config(EdgeConfig(), "sync", 100)
    assert plain.mode == "sync" and plain.effective_max_inflight == 1 and not plain.real_time_chunking
    assert mode_config(EdgeConfig(), "async_rollforward", 100).replan == "auto"  # the mode runs the defaults


def test_real_time_chunking_variant_guides_async_naive_chunks_and_only_there():
    config = mode_config(EdgeConfig(), "async_naive_rtc", 200)
    assert (config.mode, config.real_time_chunking, config.simulated_latency_ms) == ("async_naive", True, 200.0)
    assert not mode_config(EdgeConfig(real_time_chunking=True, mode="async_naive"), "async_naive", 0).real_time_chunking


def test_ratios_to_sync_at_the_same_latency():
    results = {
        "sync": {"200": {"reaction_s": 0.6, "completion_s": 4.0}},
        "async_rollforward": {"200": {"reaction_s": 0.3, "completion_s": 3.0}},
    }
    add_ratios_to_sync(results)
    assert results["async_rollforward"]["200"]["reaction_vs_sync"] == pytest.approx(0.5)
    assert results["async_rollforward"]["200"]["completion_vs_sync"] == pytest.approx(0.75)
    assert results["sync"]["200"]["reaction_vs_sync"] == pytest.approx(1.0)


def test_bench_cells_with_the_expert_policy_show_latency_hidden_by_roll_forward():
    """End to end on the sim (virtual clock): roll-forward plus a first chunk planned before
    the start hide a 400 ms inference from the task time; sync pays for every chunk."""
    from robot_rl.bench.async_control import measure_cells
    from robot_rl.hardware.sim import ScriptedExpert, SimConfig, SimSO101
    from robot_rl.hardware.sim.expert_policy import ExpertChunkPolicy

    robot = SimSO101(SimConfig(cameras=()))
    robot.connect()
    try:
        policy = ExpertChunkPolicy(ScriptedExpert(robot, max_joint_step=3.0, cartesian_step=0.006, careful_step=0.003))
        results = measure_cells(robot, policy, EdgeConfig(), seeds=[2_000_000, 2_000_001], reaction_seeds=[3_000_000],
                                latencies_ms=(0, 400), modes=("sync", "async_rollforward"), families=["push"],
                                progress=False)
    finally:
        robot.disconnect()
    rollforward, sync = results["async_rollforward"], results["sync"]
    assert rollforward["0"]["success"] == rollforward["400"]["success"] == 1.0
    assert rollforward["400"]["completion_s"] <= 1.05 * rollforward["0"]["completion_s"]
    assert sync["400"]["completion_s"] > 1.2 * sync["0"]["completion_s"]  # waits 400 ms for each chunk
    assert rollforward["400"]["stall_s_per_episode"] == 0.0
    cell = rollforward["400"]
    assert set(cell) >= {"success", "completion_s", "stall_s_per_episode", "reaction_s"}
    assert "late_tick_frac" not in cell  # always 0 on the virtual clock: the real-time run measures it
    assert cell["reaction_s"] >= cell["reaction_floor_s"]  # nothing reacts faster than one inference + a tick
