"""Rewards, returns and chunk transitions on hand-made episodes."""

from __future__ import annotations

import numpy as np
import pytest

from robot_rl.learner.config import RewardConfig
from robot_rl.learner.rewards import (
    chunk_rewards,
    discounted_returns,
    discounted_sum,
    episode_rewards,
    intervention_penalties,
    n_step_targets,
    potential_shaping,
    takeover_steps,
    td_lambda_returns,
    transition_fields,
)
from robot_rl.policies.augment import build_sample

SPARSE = dict(intervention_penalty=0.0, dense_scale=0.0)


def episode(n: int, *, success_at: int | None = None, interventions: tuple[int, ...] = (),
            done: bool | None = True, dense: np.ndarray | None = None) -> dict:
    """Columns like the replay index holds; state[0] = step index, image value = step index."""
    success = np.zeros(n, bool)
    if success_at is not None:
        success[success_at:] = True
    flags = np.zeros(n, bool)
    flags[list(interventions)] = True
    out = {"state": np.arange(n, dtype=np.float32)[:, None].repeat(6, 1),
           "action": np.arange(n, dtype=np.float32)[:, None].repeat(6, 1) + 0.5,
           "images.front": np.arange(n, dtype=np.uint8)[:, None, None, None].repeat(4, 1).repeat(4, 2).repeat(3, 3),
           "is_intervention": flags, "success": success, "policy_version": np.arange(n) // 4,
           "reward": np.zeros(n, np.float32) if dense is None else dense, "instruction": "pick"}
    if done is not None:
        out["done"] = np.zeros(n, bool)
        out["done"][-1] = done
    return out


# ---------------------------------------------------------------- intervention penalty


def test_takeover_steps_are_starts_of_intervention_segments():
    flags = np.array([1, 1, 0, 0, 1, 1, 0, 1], bool)
    assert takeover_steps(flags).tolist() == [4, 7]  # a takeover at step 0 has no policy step before it


def test_penalty_is_split_over_the_policy_steps_just_before_each_takeover():
    flags = np.array([0, 0, 0, 1, 1, 0, 0, 1], bool)
    out = intervention_penalties(flags, penalty=1.0, window=2)
    np.testing.assert_allclose(out, [0, -0.5, -0.5, 0, 0, -0.5, -0.5, 0])


def test_penalty_window_blames_only_policy_driven_steps():
    flags = np.array([0, 1, 0, 1], bool)
    out = intervention_penalties(flags, penalty=1.0, window=3)
    # takeover at 1 blames step 0; takeover at 3 blames steps 0 and 2 (step 1 was the human)
    np.testing.assert_allclose(out, [-1.5, 0, -0.5, 0])
    assert intervention_penalties(np.array([1, 1, 0], bool), 1.0, 5).sum() == 0.0


# ---------------------------------------------------------------- episode rewards


def test_success_reward_lands_on_the_first_success_step_and_later_steps_count_nothing():
    ep = episode(6, success_at=3, interventions=(5,))
    r = episode_rewards(ep, RewardConfig(success_reward=2.0, penalty_window=1))
    assert r.success and r.finished and r.horizon == 4
    np.testing.assert_allclose(r.rewards, [0, 0, 0, 2, 0, 0])  # the takeover at 5 is after success


def test_failure_reward_on_the_last_step_only_once_the_episode_is_finished():
    config = RewardConfig(failure_reward=-1.0, **SPARSE)
    np.testing.assert_allclose(episode_rewards(episode(4), config).rewards, [0, 0, 0, -1])
    open_episode = episode_rewards(episode(4, done=False), config)
    assert not open_episode.finished and not open_episode.success
    np.testing.assert_allclose(open_episode.rewards, 0)
    assert episode_rewards(episode(4, done=None), config).finished  # no done column: taken as finished


def test_rewards_combine_penalty_success_and_dense_shaping():
    dense = np.array([0.0, 0.2, 0.5, 1.0], np.float32)
    config = RewardConfig(gamma=1.0, dense_scale=0.5, intervention_penalty=1.0, penalty_window=1)
    r = episode_rewards(episode(4, success_at=3, interventions=(2,), dense=dense), config)
    np.testing.assert_allclose(r.rewards, [0.0, 0.1 - 1.0, 0.15, 0.25 + 1.0])


def test_potential_shaping_telescopes_to_the_progress_made():
    phi = np.array([0.1, 0.3, 0.2, 0.9])
    f = potential_shaping(phi, gamma=1.0)
    np.testing.assert_allclose(f, [0.0, 0.2, -0.1, 0.7])
    assert f.sum() == pytest.approx(phi[-1] - phi[0])


def test_reward_config_rejects_bad_values():
    # An unknown key (learner.trainer.rewards.gama) is the strict config's: test_learning_integration.
    with pytest.raises(ValueError, match="gamma"):
        RewardConfig(gamma=1.5)
    with pytest.raises(ValueError, match="penalty_window"):
        RewardConfig(penalty_window=0)


# ---------------------------------------------------------------- returns and targets


def test_discounted_returns_by_hand():
    np.testing.assert_allclose(discounted_returns(np.array([1.0, 0.0, 2.0]), 0.5), [1.5, 1.0, 2.0])
    np.testing.assert_allclose(discounted_returns(np.array([0.0, 0.0]), 0.5, bootstrap=4.0), [1.0, 2.0])
    assert discounted_sum(np.array([1.0, 1.0, 1.0]), 0.5) == pytest.approx(1.75)


def test_n_step_targets_by_hand_and_their_limits():
    r = np.array([1.0, 0.0, 2.0])
    v = np.array([10.0, 20.0, 30.0, 40.0])  # V(s_0..s_3); s_3 after the last step
    np.testing.assert_allclose(n_step_targets(r, v, 0.5, 2), [1 + 0.25 * 30, 0 + 1.0 + 0.25 * 40, 2 + 0.5 * 40])
    np.testing.assert_allclose(n_step_targets(r, v, 0.5, 1), td_lambda_returns(r, v, 0.5, 0.0))
    np.testing.assert_allclose(n_step_targets(r, v, 0.5, 5), discounted_returns(r, 0.5, bootstrap=40.0))
    np.testing.assert_allclose(td_lambda_returns(r, v, 0.5, 1.0), discounted_returns(r, 0.5, bootstrap=40.0))
    with pytest.raises(ValueError, match="T \\+ 1"):
        n_step_targets(r, v[:3], 0.5, 1)


def test_td_lambda_is_the_lambda_weighted_mix_of_n_step_returns():
    rng = np.random.default_rng(0)
    r, v = rng.standard_normal(4), rng.standard_normal(5)
    gamma, lam = 0.9, 0.6
    g = [n_step_targets(r, v, gamma, n)[0] for n in range(1, 5)]
    mix = (1 - lam) * sum(lam ** (n - 1) * g[n - 1] for n in range(1, 4)) + lam ** 3 * g[3]
    assert td_lambda_returns(r, v, gamma, lam)[0] == pytest.approx(mix)


def test_chunk_level_returns_equal_step_level_returns_at_chunk_boundaries():
    rng = np.random.default_rng(1)
    r, gamma, h = rng.standard_normal(12), 0.9, 4
    chunk_level = discounted_returns(chunk_rewards(r, h, gamma), gamma ** h)
    np.testing.assert_allclose(chunk_level, discounted_returns(r, gamma)[::h])


# ---------------------------------------------------------------- per-sample transitions


def test_transition_inside_the_episode_bootstraps_at_the_next_chunk_boundary():
    ep, config = episode(10, success_at=7), RewardConfig(gamma=0.5, **SPARSE)
    f = transition_fields(ep, t=2, offset=1, chunk_size=3, cameras=("front",), config=config)
    assert f["return"] == pytest.approx(0.5 ** 4)  # chunk starts at 3, success reward at 7
    assert f["chunk_reward"] == 0.0 and f["chunk_discount"] == pytest.approx(0.125)
    assert f["transition_valid"] and f["episode_success"] and f["episode_finished"]
    assert f["next.state"][0] == 6 and f["next.images.front"][0, 0, 0] == 6  # observation at 3 + 3
    assert f["policy_version"] == 0  # of the step at t=2


def test_policy_steps_before_a_rescue_are_not_autonomous_successes():
    # Policy 0-3, operator 4-5 (takes over), policy 6-9, success at 8: only the policy steps
    # after the hand-back reached success on their own.
    ep, config = episode(10, success_at=8, interventions=(4, 5)), RewardConfig(**SPARSE)
    flags = [bool(transition_fields(ep, t, 0, 2, ("front",), config)["autonomous_success"]) for t in range(10)]
    assert flags == [False] * 4 + [True] * 6
    assert all(transition_fields(ep, t, 0, 2, ("front",), config)["episode_success"] for t in range(10))
    # The offset moves the chunk start past the takeover: judged from where the chunk starts.
    assert transition_fields(ep, 2, 3, 2, ("front",), config)["autonomous_success"]
    # A takeover after the first success changes nothing; a failed episode never counts.
    assert transition_fields(episode(10, success_at=3, interventions=(6,)), 0, 0, 2, ("front",),
                             config)["autonomous_success"]
    assert not transition_fields(episode(10, interventions=(4,)), 6, 0, 2, ("front",), config)["autonomous_success"]


def test_episode_return_is_the_same_for_every_step_of_an_episode():
    config = RewardConfig(gamma=0.5, **SPARSE)
    fields = [transition_fields(episode(10, success_at=3), t, 0, 2, ("front",), config) for t in range(10)]
    assert {float(f["episode_return"]) for f in fields} == {0.5 ** 3}  # success reward at step 3, seen from step 0
    assert float(fields[3]["return"]) == 1.0 and float(fields[0]["return"]) == 0.5 ** 3  # return-to-go grows


def test_transition_that_reaches_the_terminal_step_does_not_bootstrap():
    ep, config = episode(10, success_at=7), RewardConfig(gamma=0.5, **SPARSE)
    f = transition_fields(ep, t=5, offset=0, chunk_size=3, cameras=("front",), config=config)
    assert f["chunk_discount"] == 0.0 and f["transition_valid"]
    assert f["chunk_reward"] == pytest.approx(0.25) == f["return"]
    assert f["next.state"][0] == 7


def test_transition_of_an_open_episode_past_its_recorded_end_has_no_target():
    ep, config = episode(10, done=False), RewardConfig(gamma=0.5, **SPARSE)
    f = transition_fields(ep, t=8, offset=0, chunk_size=3, cameras=("front",), config=config)
    assert not f["transition_valid"] and not f["episode_finished"] and f["chunk_discount"] == 0.0
    assert transition_fields(ep, t=6, offset=0, chunk_size=3, cameras=("front",), config=config)["transition_valid"]


def test_transition_clips_the_offset_like_the_sample_builder():
    ep, config = episode(10, success_at=9), RewardConfig(gamma=0.5, **SPARSE)
    sample = build_sample(ep, 8, 5, 3, ("front",))
    f = transition_fields(ep, t=8, offset=5, chunk_size=3, cameras=("front",), config=config)
    assert sample["actions"][0, 0] == 9.5  # the chunk starts at 9 (offset clipped to 1)
    assert f["return"] == pytest.approx(1.0)  # ... and so does the return
