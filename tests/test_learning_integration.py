"""The learning algorithms wired into the learner: registry and configs, reward fields in
sampled batches, episode ends, policy versions for the staleness bound, outcomes per
policy version and the TensorBoard curves."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

from robot_rl.config import ConfigError, load_config
from robot_rl.learner.algorithms.awr import AWR
from robot_rl.learner.algorithms.bc import WeightedBC
from robot_rl.learner.algorithms.config import ALGORITHMS, AWRConfig, RLConfig, RWRConfig, WeightedBCConfig
from robot_rl.learner.algorithms.rl import ChunkQLearning
from robot_rl.learner.algorithms.rwr import RWR
from robot_rl.learner.config import LearnerConfig, RewardConfig
from robot_rl.learner.index import SampleSpec, SamplingIndex, dataset_episode_to_columns, steps_to_columns
from robot_rl.learner.metrics import LearningLogger, OutcomeTracker, outcome_from_columns, staleness_values
from robot_rl.learner.store import ReplayStore
from robot_rl.learner.trainer import Trainer
from tests.learner_helpers import CAMERAS, make_steps, store_config, tiny_policy, trainer_config
from tests.test_learner_store import segments

SPEC = SampleSpec(chunk_size=4, cameras=CAMERAS, max_state_offset=0, rewards=RewardConfig(gamma=1.0))
ONLINE_ONLY = {"online": 1.0}


def sample_all(index: SamplingIndex, n: int = 64) -> dict:
    return index.sample(n, ONLINE_ONLY, SPEC, np.random.default_rng(0))


# ---------------------------------------------------------------- registry and configs


@pytest.mark.parametrize("recipe,cls", [("bc", WeightedBC), ("hgdagger", WeightedBC), ("rwr", RWR), ("awr", AWR),
                                        ("rl", ChunkQLearning)])
def test_each_learner_recipe_builds_its_algorithm(recipe, cls):
    learner = load_config([f"learner={recipe}"]).learner
    algorithm = ALGORITHMS.build(learner.algorithm, tiny_policy(), learner.trainer, torch.device("cpu"))
    assert type(algorithm) is cls and algorithm.params is learner.algorithm


def test_an_algorithm_setting_on_the_command_line_reaches_the_algorithm():
    learner = load_config(["learner=rwr", "learner.algorithm.beta=0.25",
                           "learner.algorithm.staleness.max_staleness=3"]).learner
    algorithm = ALGORITHMS.build(learner.algorithm, tiny_policy(), learner.trainer, torch.device("cpu"))
    assert algorithm.params.beta == 0.25 and algorithm.staleness.config.max_staleness == 3
    assert algorithm.params.score_streams == ("online",)  # the config's list becomes the dataclass's tuple


def test_the_algorithm_is_chosen_apart_from_the_recipe():
    learner = load_config(["learner=hgdagger", "learner/algorithm=awr", "learner.algorithm.beta=2"]).learner
    assert isinstance(learner.algorithm, AWRConfig) and learner.algorithm.beta == 2.0
    assert learner.trainer.stream_ratios == {"online": 0.0, "intervention": 0.5, "demonstration": 0.5}
    assert isinstance(load_config(["learner/algorithm=rl"]).learner.algorithm, RLConfig)


def test_hgdagger_is_behaviour_cloning_on_corrections_and_demonstrations_only():
    learner = load_config(["learner=hgdagger"]).learner
    assert ALGORITHMS.name_of(learner.algorithm) == "bc"
    assert learner.trainer.stream_ratios == {"online": 0.0, "intervention": 0.5, "demonstration": 0.5}


def test_the_critic_recipes_shape_rewards_with_the_sims_progress():
    assert load_config(["learner=awr"]).learner.trainer.rewards.dense_scale == 0.5
    assert load_config(["learner=rwr"]).learner.trainer.rewards == RewardConfig()


@pytest.mark.parametrize("override,named", [
    (["learner=rwr", "learner.algorithm.betaa=1"], "learner.algorithm.betaa"),  # not an RWR setting
    (["learner=bc", "learner.algorithm.beta=1"], "learner.algorithm.beta"),  # bc has no beta
    (["learner.trainer.rewards.gama=0.9"], "gamma"),
    (["learner=rwr", "learner.algorithm.score=reward"], "score"),  # RWRConfig's own check
    (["learner.algorithm.staleness.mode=ignore", "learner=rwr"], "mode"),
    (["learner/algorithm=ppo"], "awr, bc, rl, rwr"),
])
def test_a_wrong_learner_setting_is_refused_with_what_is_valid(override, named):
    with pytest.raises(ConfigError, match=named):
        load_config(override)


def test_a_learner_config_without_a_registered_algorithm_is_refused():
    with pytest.raises(TypeError, match="registered"):
        LearnerConfig(algorithm={"beta": 0.5})
    assert isinstance(LearnerConfig().algorithm, WeightedBCConfig)  # a LearnerConfig in code: plain BC


# ---------------------------------------------------------------- reward fields in batches


def test_a_growing_episode_has_no_outcome_until_its_done_step_arrives():
    index = SamplingIndex(CAMERAS)
    steps = make_steps(12)
    steps[-1].success = True
    index.append(("r", 0, 0), steps_to_columns(steps[:8], CAMERAS), "pick the cube")
    open_batch = sample_all(index)
    assert not open_batch["episode_finished"].any() and not open_batch["episode_success"].any()
    assert (open_batch["return"] == 0).all()  # no success seen yet: nothing to return

    index.append(("r", 0, 0), steps_to_columns(steps[8:], CAMERAS), "pick the cube")
    done_batch = sample_all(index)
    assert done_batch["episode_finished"].all() and done_batch["episode_success"].all()
    assert torch.allclose(done_batch["return"], torch.ones(64))  # gamma 1: every step sees the success
    assert {"chunk_reward", "chunk_discount", "transition_valid", "next.state", "next.images.front",
            "policy_version"} <= set(done_batch)


def test_a_cut_short_episode_becomes_finished_in_the_live_index_as_after_a_restart(tmp_path):
    with ReplayStore(store_config(tmp_path)) as store:
        store.ingest(segments("r0", 1, make_steps(12, robot=0, episode=1))[0])  # 4 steps, no done
        assert not sample_all(store.index)["episode_finished"].any()
        for s in segments("r0", 2, make_steps(4, robot=0, episode=2)):
            store.ingest(s)  # episode 1 is cut short when episode 2 starts
        assert sample_all(store.index)["episode_finished"].all()
    with ReplayStore(store_config(tmp_path)) as reopened:
        assert sample_all(reopened.index)["episode_finished"].all()


def test_dataset_episodes_end_with_a_terminal_step():
    episode = {"state": np.zeros((5, 6)), "action": np.zeros((5, 6)), "images.front": np.zeros((5, 16, 16, 3))}
    columns = dataset_episode_to_columns(episode, CAMERAS)
    assert columns["done"].tolist() == [False] * 4 + [True]


# ---------------------------------------------------------------- policy versions for the staleness bound


def test_the_trainer_reports_each_published_and_resumed_version_to_the_algorithm(tmp_path):
    index = SamplingIndex(CAMERAS)
    for episode in range(2):
        index.append(("r", episode, 0), steps_to_columns(make_steps(12, episode=episode), CAMERAS), "pick the cube")
    config = trainer_config(tmp_path / "ckpt", publish_every_updates=2)
    rwr = RWRConfig(drop_unfinished=False, failures="keep")
    trainer = Trainer(tiny_policy(), index, config, rwr, publish=lambda snapshot: None)
    assert trainer.algorithm.staleness.current_version == 0
    for _ in range(5):
        metrics = trainer.update_once()  # publishes after updates 2 and 4
    assert trainer.version == 2 and trainer.algorithm.staleness.current_version == 2
    assert metrics["staleness/known"] == 1.0 and metrics["staleness/count_2"] > 0  # steps were made by v0
    trainer.checkpoint()

    resumed = Trainer(tiny_policy(), index, config, rwr)
    resumed.resume()
    assert resumed.algorithm.staleness.current_version == 2


# ---------------------------------------------------------------- outcomes and curves


def test_an_episode_counts_for_the_version_that_drove_most_of_it():
    flags = np.array([0, 0, 1, 1, 0, 0, 0, 1], bool)
    versions = np.array([3, 3, 3, 4, 4, 4, 4, 4])
    outcome = outcome_from_columns("r", 1, np.zeros(8, bool), flags, versions)
    assert outcome.policy_version == 4  # policy steps: v3 twice, v4 three times
    assert outcome.takeovers == 2 and outcome.intervention_rate == 3 / 8 and not outcome.success


def test_the_store_records_each_committed_episode_outcome_also_after_a_restart(tmp_path):
    steps = make_steps(8, episode=1, version=2)
    steps[-1].success = True
    for s in steps[2:4]:
        s.is_intervention = True
    with ReplayStore(store_config(tmp_path)) as store:
        for segment in segments("r0", 1, steps):
            store.ingest(segment)
        for segment in segments("r0", 2, make_steps(4, episode=2, version=3)):
            store.ingest(segment)
        live = store.outcomes.per_version()
    with ReplayStore(store_config(tmp_path)) as reopened:
        rebuilt = reopened.outcomes.per_version()
    for stats in (live, rebuilt):
        assert sorted(stats) == [2, 3]
        assert stats[2].success_rate == 1.0 and stats[2].intervention_rate == 2 / 8
        assert stats[3].success_rate == 0.0 and stats[3].episodes_with_takeover == 0


def test_the_logger_writes_losses_staleness_and_success_per_version(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = OutcomeTracker()
    logger = LearningLogger(tmp_path / "tb", tracker, every_updates=2)
    metrics = {"loss": 0.5, "ess": 3.0, "staleness/count_0": 2.0, "staleness/count_3": 1.0}
    assert staleness_values(metrics).tolist() == [0, 0, 3]
    for version, success in ((0, False), (0, True), (1, True)):
        tracker.add(outcome_from_columns("r", 0, np.array([success]), np.zeros(1, bool), np.array([version])))
    for step in range(1, 5):
        logger.log_update(step, metrics, version=1)
    logger.close()

    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "histograms": 0}).Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [2, 4]  # every 2nd update
    assert [e.step for e in events.Scalars("train/ess")] == [2, 4]
    assert events.Histograms("train/staleness")[0].histogram_value.num == 3
    per_version = {e.step: e.value for e in events.Scalars("per_version/success_rate")}
    assert per_version == {0: 0.5, 1: 1.0}
    assert [e.value for e in events.Scalars("episodes/success")] == [0.0, 1.0, 1.0]
