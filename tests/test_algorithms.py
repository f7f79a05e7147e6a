"""Learning algorithms: weights, advantages, TD targets, staleness bound, and one real update each."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from robot_rl.learner.algorithms.awr import AWR, advantage_weights, value_targets
from robot_rl.learner.algorithms.base import NonFiniteUpdateError
from robot_rl.learner.algorithms.config import (
    ALGORITHMS,
    AWRConfig,
    RejectionConfig,
    RLConfig,
    RWRConfig,
    StalenessConfig,
)
from robot_rl.learner.algorithms.rl import ChunkQLearning, best_of_n, chunked_td_target, gather_chunks
from robot_rl.learner.algorithms.rwr import RWR, effective_sample_size, exponential_weights, rwr_weights
from robot_rl.learner.config import RewardConfig, TrainerConfig
from robot_rl.learner.rewards import transition_fields
from robot_rl.learner.staleness import StalenessBound, bound_staleness
from robot_rl.learner.streams import STREAMS
from robot_rl.policies.augment import build_sample
from tests.learner_helpers import CAMERAS, IMG, tiny_policy

ONLINE, INTERVENTION, DEMO = 0, 1, 2
H = 4  # tiny_policy's chunk size


# ---------------------------------------------------------------- staleness


def test_drop_mode_removes_exactly_the_samples_older_than_k():
    result = bound_staleness(torch.tensor([5, 4, 3, 2, -1]), 5, StalenessConfig(max_staleness=1, mode="drop"))
    assert result.weights.tolist() == [1, 1, 0, 0, 1]  # version -1 (unknown) is never penalised
    assert result.dropped == 2 and result.downweighted == 0
    assert result.histogram == {0: 1, 1: 1, 2: 1, 3: 1}


def test_downweight_mode_decays_geometrically_beyond_k():
    config = StalenessConfig(max_staleness=1, mode="downweight", decay=0.5)
    result = bound_staleness(torch.tensor([5, 4, 3, 2, 6]), 5, config)
    assert result.weights.tolist() == [1, 1, 0.5, 0.25, 1]  # a sample newer than "current" counts as fresh
    assert result.dropped == 0 and result.downweighted == 2
    assert result.metrics()["staleness/count_0"] == 2.0 and result.metrics()["staleness/max"] == 3.0


def test_bound_applies_only_to_the_configured_streams():
    bound = StalenessBound(StalenessConfig(max_staleness=0, mode="drop", streams=("online",)))
    batch = {"actions": torch.zeros(3, H, 6), "policy_version": torch.tensor([1, 1, 1]),
             "stream": torch.tensor([ONLINE, INTERVENTION, DEMO])}
    weights, metrics = bound(batch)
    assert weights.tolist() == [1, 1, 1] and metrics["staleness/known"] == 0.0  # version unknown: skipped
    bound.current_version = 3
    weights, metrics = bound(batch)
    assert weights.tolist() == [0, 1, 1] and metrics["staleness/dropped"] == 1.0


def test_staleness_config_rejects_bad_values():
    with pytest.raises(ValueError, match="mode"):
        StalenessConfig(mode="ignore")
    with pytest.raises(ValueError, match="unknown stream"):
        StalenessConfig(streams=("onlin",))


# ---------------------------------------------------------------- weights


def test_effective_sample_size_on_known_weights():
    assert effective_sample_size(torch.ones(4)) == pytest.approx(4.0)
    assert effective_sample_size(torch.tensor([1.0, 0, 0, 0])) == pytest.approx(1.0)
    assert effective_sample_size(torch.tensor([2.0, 1.0, 1.0])) == pytest.approx(16 / 6)
    assert effective_sample_size(torch.zeros(3)) == 0.0


def test_exponential_weights_normalise_clip_and_reject():
    w = exponential_weights(torch.tensor([0.0, 0.0, 0.0]), beta=1.0, max_weight=10.0)
    assert w.tolist() == [1.0, 1.0, 1.0]
    w = exponential_weights(torch.tensor([0.0, 10.0, 0.0, 0.0]), beta=1.0, max_weight=2.0)
    assert float(w.max()) == pytest.approx(2.0) and w[1] == w.max()
    w = exponential_weights(torch.tensor([1.0, 2.0]), beta=1.0, max_weight=10.0,
                            log_factors=torch.tensor([0.0, -float("inf")]))
    assert w.tolist() == [1.0, 0.0]
    big = exponential_weights(torch.tensor([1000.0, 999.0]), beta=0.1, max_weight=10.0)
    assert torch.isfinite(big).all()


def test_rwr_weights_successes_above_failures_and_interventions_up():
    stream = torch.tensor([ONLINE, ONLINE, INTERVENTION, ONLINE])
    success = torch.tensor([True, False, False, True])
    finished = torch.tensor([True, True, True, False])
    scores = torch.tensor([0.5, 0.5, 0.5, 0.5])
    keep = rwr_weights(scores, stream, success, finished, RWRConfig(failures="downweight", failure_weight=0.1,
                                                                   intervention_weight=2.0, drop_unfinished=True))
    assert keep[0] > keep[1] > 0  # failure down-weighted, not dropped
    assert keep[2] == pytest.approx(2.0)  # a correction in a failed episode still counts: its multiplier
    assert keep[3] == 0.0  # outcome unknown yet
    drop = rwr_weights(scores, stream, success, finished, RWRConfig(failures="drop"))
    assert drop[1] == 0.0 and drop[0] > 0  # rejection sampling


def test_rwr_weights_corrections_by_their_stream_not_by_the_penalised_episode_return():
    # Online success (R 0.4), a correction inside a rescued episode whose return carries the takeover
    # penalty (R -0.6), a demonstration (R 0.4). The penalty blames the policy, not the person.
    stream = torch.tensor([ONLINE, INTERVENTION, DEMO])
    success, finished = torch.tensor([True, False, True]), torch.ones(3, dtype=torch.bool)
    scores = torch.tensor([0.4, -0.6, 0.4])
    experts = rwr_weights(scores, stream, success, finished, RWRConfig(beta=0.5))
    assert experts.tolist() == pytest.approx([1.0, 1.0, 1.0])
    everything = rwr_weights(scores, stream, success, finished,
                             RWRConfig(beta=0.5, score_streams=("online", "intervention", "demonstration")))
    assert everything[1] < 0.2 * everything[2]  # the old whole-batch weighting: exp(-1 / 0.5) of a demo's
    with pytest.raises(ValueError, match="score_streams"):
        RWRConfig(score_streams=("robot",))


def test_rwr_weights_prefer_higher_returns_and_respect_the_clip():
    stream = torch.full((4,), ONLINE)
    w = rwr_weights(torch.tensor([0.0, 1.0, 2.0, 3.0]), stream, None, None, RWRConfig(beta=0.5, max_weight=3.0))
    assert torch.all(w[1:] >= w[:-1]) and float(w.max()) <= 3.0


# ---------------------------------------------------------------- advantages and TD targets


def test_value_targets_mix_monte_carlo_and_td_and_mask_missing_ones():
    targets, has = value_targets(
        returns=torch.tensor([1.0, 1.0, 0.0]), chunk_reward=torch.tensor([0.0, 0.0, 0.5]),
        chunk_discount=torch.tensor([0.5, 0.5, 0.0]), next_value=torch.tensor([0.8, 0.8, 9.0]),
        finished=torch.tensor([True, False, False]), valid=torch.tensor([True, True, False]), mc_mix=0.25)
    assert targets.tolist() == pytest.approx([0.25 * 1.0 + 0.75 * 0.4, 0.4, 0.0])
    assert has.tolist() == [True, True, False]


def test_advantage_sign_matches_return_versus_value():
    returns, values = torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0.5, 0.5, 0.5])
    w = advantage_weights(returns - values, torch.tensor([True, True, True]), beta=1.0, max_weight=20.0,
                          normalize=False)
    assert w[0] > 1.0 > w[1] and w[2] == pytest.approx(1.0)
    assert w[0] == pytest.approx(np.exp(0.5))
    clipped = advantage_weights(torch.tensor([50.0, 0.0]), torch.tensor([True, False]), 1.0, 20.0, False)
    assert clipped.tolist() == [20.0, 1.0]  # clip; no target -> neutral weight


def test_chunked_td_target_uses_min_over_ensemble_and_max_over_candidates():
    # next_q [ensemble=2, candidates=3, batch=2]
    next_q = torch.tensor([[[1.0, 5.0], [4.0, 2.0], [3.0, 0.0]],
                           [[2.0, 4.0], [3.0, 6.0], [9.0, 1.0]]])
    # pessimistic: [[1, 4], [3, 2], [3, 0]] -> max over candidates: [3, 4]
    y = chunked_td_target(torch.tensor([0.5, 1.0]), torch.tensor([0.9, 0.0]), next_q)
    assert y.tolist() == pytest.approx([0.5 + 0.9 * 3.0, 1.0])


def test_best_of_n_picks_the_highest_pessimistic_q_candidate():
    q = torch.tensor([[[1.0, 5.0], [4.0, 2.0], [3.0, 0.0]],
                      [[2.0, 4.0], [3.0, 6.0], [9.0, 1.0]]])
    index = best_of_n(q)
    assert index.tolist() in ([1, 0], [2, 0])  # sample 0 ties at 3 (candidates 1 and 2), sample 1: candidate 0
    candidates = torch.arange(3 * 2, dtype=torch.float32).reshape(3, 2, 1, 1).expand(3, 2, H, 6)
    chosen = gather_chunks(candidates, torch.tensor([2, 0]))
    assert chosen[0, 0, 0] == 4.0 and chosen[1, 0, 0] == 1.0


# ---------------------------------------------------------------- real updates on a tiny FlowVLA


def make_episode(n: int, seed: int, *, success: bool, intervention_from: int | None = None) -> dict:
    rng = np.random.default_rng(seed)
    flags = np.zeros(n, bool)
    if intervention_from is not None:
        flags[intervention_from:] = True
    done = np.zeros(n, bool)
    done[-1] = True
    return {"state": rng.standard_normal((n, 6)).astype(np.float32),
            "action": rng.standard_normal((n, 6)).astype(np.float32),
            f"images.{CAMERAS[0]}": rng.integers(0, 256, (n, IMG, IMG, 3), dtype=np.uint8),
            "is_intervention": flags, "success": np.arange(n) == n - 1 if success else np.zeros(n, bool),
            "done": done, "policy_version": np.full(n, seed % 3), "reward": np.zeros(n, np.float32),
            "instruction": "pick the cube"}


def make_batch(n: int = 8, seed: int = 0) -> dict:
    """What the sampler gives once it adds ``transition_fields`` to each ``build_sample`` sample."""
    episodes = [make_episode(12, 1, success=True), make_episode(12, 2, success=False, intervention_from=6),
                make_episode(12, 3, success=False)]
    rng = np.random.default_rng(seed)
    config = RewardConfig(gamma=0.9)
    samples, streams = [], []
    for _ in range(n):
        ep = episodes[int(rng.integers(len(episodes)))]
        t, offset = int(rng.integers(12)), int(rng.integers(3))
        samples.append({**build_sample(ep, t, offset, H, CAMERAS),
                        **transition_fields(ep, t, offset, H, CAMERAS, config)})
        streams.append(INTERVENTION if ep["is_intervention"][t] else ONLINE)
    batch = {k: torch.as_tensor(np.stack([s[k] for s in samples])) for k in samples[0]}
    batch.update(instruction=["pick the cube"] * n, weight=torch.ones(n), stream=torch.tensor(streams),
                 reward=torch.zeros(n), is_intervention=torch.tensor(streams) == INTERVENTION)
    return batch


TRAINER = TrainerConfig(batch_size=8, lr=1e-3, device="cpu", seed=0)
PARAMS = {"rwr": RWRConfig, "awr": AWRConfig, "rl": RLConfig}
SMALL = {"rwr": {}, "awr": {"critic_hidden": 16},
         "rl": {"critic_hidden": 16, "num_candidates": 3, "warmup_updates": 0}}
CLASSES = {"rwr": RWR, "awr": AWR, "rl": ChunkQLearning}


def build(name: str, policy=None, **params):
    """Algorithm ``name`` with ``params`` (fields of its config), built as the trainer builds it."""
    policy = tiny_policy(seed=0).train() if policy is None else policy
    return ALGORITHMS.build(PARAMS[name](**params), policy, TRAINER, torch.device("cpu"))


def make_algorithm(name: str):
    policy = tiny_policy(seed=0).train()
    algorithm = build(name, policy, **SMALL[name])
    algorithm.set_policy_version(2)
    return policy, algorithm


def run_updates(name: str, updates: int = 2, global_seed: int = 0):
    policy, algorithm = make_algorithm(name)
    torch.manual_seed(global_seed)  # other threads may draw from torch's global stream: it must not matter
    metrics = [algorithm.update(make_batch(seed=i)) for i in range(updates)]
    return policy, algorithm, metrics


def snapshot(*modules: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for m in modules for p in m.parameters()]


@pytest.mark.parametrize("name", ["rwr", "awr", "rl"])
def test_one_update_changes_the_policy_and_critics_and_reports_metrics(name):
    policy = tiny_policy(seed=0).train()
    algorithm = build(name, policy, **SMALL[name])
    assert type(algorithm) is CLASSES[name] and algorithm.params == PARAMS[name](**SMALL[name])
    algorithm.set_policy_version(2)
    before_policy, before_extra = snapshot(policy), snapshot(*algorithm.extra_modules().values())
    metrics = algorithm.update(make_batch())
    assert np.isfinite(metrics["loss"]) and metrics["loss"] > 0 and metrics["skipped"] == 0.0
    actor_samples = 16 if name == "rl" else 8  # rl regresses on recorded and best-of-N chunks
    assert 1.0 <= metrics["ess"] <= actor_samples and metrics["staleness/known"] == 1.0
    assert any(not torch.equal(a, b) for a, b in zip(before_policy, snapshot(policy), strict=True))
    after_extra = snapshot(*algorithm.extra_modules().values())
    assert name == "rwr" or any(not torch.equal(a, b) for a, b in zip(before_extra, after_extra, strict=True))
    assert set(algorithm.optimizers()) >= {"policy"}


@pytest.mark.parametrize("name", ["rwr", "awr", "rl"])
def test_same_seed_gives_identical_parameters(name):
    policy_a, algo_a, metrics_a = run_updates(name, global_seed=1)
    policy_b, algo_b, metrics_b = run_updates(name, global_seed=2)
    assert metrics_a == metrics_b
    for a, b in zip(snapshot(policy_a, *algo_a.extra_modules().values()),
                    snapshot(policy_b, *algo_b.extra_modules().values()), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["awr", "rl"])
def test_restoring_what_a_checkpoint_holds_reproduces_the_next_update(name):
    """Policy, extra modules, optimisers and the algorithm's generator are the whole state."""
    policy, algorithm = make_algorithm(name)
    algorithm.update(make_batch(seed=0))
    saved = {"policy": copy.deepcopy(policy.state_dict()), "rng": algorithm.rng_state(),
             "extra": {k: copy.deepcopy(m.state_dict()) for k, m in algorithm.extra_modules().items()},
             "optim": {k: copy.deepcopy(o.state_dict()) for k, o in algorithm.optimizers().items()}}
    expected = algorithm.update(make_batch(seed=1))

    restored_policy, restored = make_algorithm(name)
    restored_policy.load_state_dict(saved["policy"])
    for k, m in restored.extra_modules().items():
        m.load_state_dict(saved["extra"][k])
    for k, o in restored.optimizers().items():
        o.load_state_dict(saved["optim"][k])
    restored.set_rng_state(saved["rng"])
    assert restored.update(make_batch(seed=1)) == expected
    for a, b in zip(snapshot(policy), snapshot(restored_policy), strict=True):
        assert torch.equal(a, b)


def test_rl_distils_the_best_chunk_once_the_critic_is_warm():
    _, algorithm, metrics = run_updates("rl", updates=1)
    assert metrics[0]["distilling"] == 1.0 and "best_q_mean" in metrics[0]
    assert 0.0 <= metrics[0]["best_is_data_fraction"] <= 1.0


def test_all_zero_weights_skip_the_step_without_touching_the_policy():
    policy = tiny_policy(seed=0).train()
    algorithm = build("rwr", policy, failures="drop")
    batch = make_batch()
    batch["episode_success"] = batch["autonomous_success"] = torch.zeros(8, dtype=torch.bool)
    batch["stream"] = torch.full((8,), ONLINE)
    before = snapshot(policy)
    metrics = algorithm.update(batch)
    assert metrics["skipped"] == 1.0 and metrics["ess"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(policy), strict=True))


def test_rwr_rejects_policy_steps_the_operator_had_to_rescue():
    batch = make_batch()
    batch["stream"] = torch.full((8,), ONLINE)
    batch["episode_success"] = torch.ones(8, dtype=torch.bool)
    batch["episode_finished"] = torch.ones(8, dtype=torch.bool)
    batch["autonomous_success"] = torch.tensor([True, False] * 4)
    rescue_fails = build("rwr")
    assert rescue_fails.update(batch)["kept_fraction"] == pytest.approx(0.5)
    credited = build("rwr", rescued_is_failure=False)
    assert credited.update(batch)["kept_fraction"] == pytest.approx(1.0)  # episode-level credit keeps all


def test_rwr_weights_whole_episodes_by_their_return_not_steps_by_return_to_go():
    batch = make_batch()
    batch["stream"] = torch.full((8,), ONLINE)
    batch["episode_finished"] = torch.ones(8, dtype=torch.bool)
    batch["autonomous_success"] = torch.ones(8, dtype=torch.bool)  # one successful attempt ...
    batch["episode_return"] = torch.full((8,), 0.5)
    batch["return"] = torch.linspace(0.1, 1.0, 8)  # ... seen at steps further and further along
    episode = build("rwr")
    assert episode.update(batch)["ess_fraction"] == pytest.approx(1.0)  # equal weights: plain BC on it
    to_go = build("rwr", score="return_to_go")
    assert to_go.update(batch)["ess_fraction"] < 0.95  # later steps weigh more
    with pytest.raises(ValueError, match="score"):
        RWRConfig(score="reward")


def test_the_staleness_bound_is_the_one_in_the_algorithm_config():
    algorithm = build("rwr", staleness=StalenessConfig(max_staleness=0, mode="drop"))
    algorithm.set_policy_version(5)
    batch = make_batch()
    batch["stream"] = torch.full((8,), ONLINE)
    metrics = algorithm.update(batch)
    assert metrics["staleness/dropped"] == 8.0 and metrics["skipped"] == 1.0  # every sample is >= 3 versions old


def test_critic_algorithms_name_the_missing_fields():
    batch = make_batch()
    del batch["chunk_reward"]
    algorithm = build("rl", tiny_policy(seed=0), **SMALL["rl"])
    with pytest.raises(KeyError, match="chunk_reward"):
        algorithm.update(batch)


def test_streams_order_matches_the_store():
    assert STREAMS.index("online") == ONLINE and STREAMS.index("intervention") == INTERVENTION


@pytest.mark.parametrize("name,loss_key", [("awr", "value_loss"), ("rl", "critic_loss")])
def test_critic_fits_its_targets_on_a_fixed_batch(name, loss_key):
    policy = tiny_policy(seed=0).train()
    params = {**SMALL[name], "critic_lr": 3e-3}
    algorithm = build(name, policy, **params)
    batch = make_batch(n=8, seed=0)
    losses = [algorithm.update(batch)[loss_key] for _ in range(20)]
    assert np.mean(losses[-3:]) < 0.5 * np.mean(losses[:3])


def failed_online_batch() -> dict:
    """Half the batch: online steps of attempts the operator had to rescue; the rest: demonstrations."""
    batch = make_batch()
    batch["stream"] = torch.tensor([ONLINE, DEMO] * 4)
    batch["episode_finished"] = torch.ones(8, dtype=torch.bool)
    batch["episode_success"] = torch.ones(8, dtype=torch.bool)
    batch["autonomous_success"] = torch.tensor([False, True] * 4)
    return batch


@pytest.mark.parametrize("name", ["awr", "rl"])
def test_critic_algorithms_do_not_imitate_failed_attempts_unless_told_to(name):
    """The critic learns from failures; the imitation terms skip them (rejection.failures: drop)."""
    params = {**SMALL[name], "warmup_updates": 10} if name == "rl" else SMALL[name]  # rl: anchor only
    rejecting = build(name, **params)
    assert rejecting.update(failed_online_batch())["kept_fraction"] == pytest.approx(0.5)
    keeping = build(name, **params, rejection=RejectionConfig(failures="keep"))
    assert keeping.update(failed_online_batch())["kept_fraction"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="failures"):
        RejectionConfig(failures="ignore")


def test_rl_candidates_use_their_own_integration_steps():
    policy, algorithm = make_algorithm("rl")
    context = torch.randn(2, 5, policy.config.d_model)
    noise = torch.randn(2, policy.chunk_size, policy.action_dim)
    coarse, fine = policy.sample(context, noise, steps=1), policy.sample(context, noise)
    assert not torch.allclose(coarse, fine)  # a step count that is ignored would give the same chunk
    with pytest.raises(ValueError, match="steps"):
        policy.sample(context, noise, steps=0)
    with pytest.raises(ValueError, match="candidate_integration_steps"):
        RLConfig(candidate_integration_steps=0)
    coarse_rl = build("rl", policy, **{**SMALL["rl"], "candidate_integration_steps": 1})
    seen, sample = [], policy.sample
    policy.sample = lambda ctx, noise, steps=None: seen.append(steps) or sample(ctx, noise, steps)
    coarse_rl.update(make_batch())
    assert seen and set(seen) == {1}  # every candidate, for the target and for best-of-N, at 1 step


@pytest.mark.parametrize("name, field", [("rwr", "actions"), ("awr", "return"), ("awr", "actions"),
                                         ("rl", "chunk_reward"), ("rl", "actions")])
def test_a_non_finite_batch_raises_and_leaves_every_weight_finite_and_the_policy_as_it_was(name, field):
    policy, algorithm = make_algorithm(name)
    batch = make_batch()
    batch[field] = torch.as_tensor(batch[field], dtype=torch.float32).clone()
    batch[field].view(-1)[0] = float("nan")
    before = snapshot(policy)
    with pytest.raises(NonFiniteUpdateError):
        algorithm.update(batch)
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(policy), strict=True))
    assert all(torch.isfinite(p).all() for p in snapshot(*algorithm.extra_modules().values()))
    assert np.isfinite(algorithm.update(make_batch(seed=1))["loss"])  # the next clean batch trains as usual
