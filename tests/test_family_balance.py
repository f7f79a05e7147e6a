"""Task families in equal shares of each batch, whatever each family's share of the stored steps."""

from __future__ import annotations

import math

import numpy as np
import pytest

from robot_rl.learner.config import FamilyBalanceConfig
from robot_rl.learner.family_balance import OTHER_FAMILY, FamilyBalancedSampler, family_of
from robot_rl.learner.index import DEMO_ROBOT, SampleSpec, SamplingIndex, steps_to_columns
from robot_rl.learner.trainer import Trainer
from tests.learner_helpers import BC, CAMERAS, make_steps, tiny_policy, trainer_config

INSTRUCTIONS = {"pick": "pick up the red cube", "push": "push the blue cube to the left",
                "place": "put the green cube in the bowl"}
SPEC = SampleSpec(chunk_size=4, cameras=CAMERAS)
RATIOS = {"online": 0.2, "intervention": 0.1, "demonstration": 0.7}
BATCH = 32


def index_with(episodes: dict[str, int], steps: int = 20) -> SamplingIndex:
    """Demonstrations and robot episodes of each family (``episodes[family]`` of each kind)."""
    index = SamplingIndex(CAMERAS)
    number = 0
    for family, count in episodes.items():
        for _ in range(count):
            number += 1
            index.append((DEMO_ROBOT, number, 0), steps_to_columns(make_steps(steps, episode=number), CAMERAS),
                         INSTRUCTIONS[family])
            robot = make_steps(steps, episode=number, robot=1)
            for step in robot[5:9]:
                step.is_intervention = True
            index.append(("r1", number, 0), steps_to_columns(robot, CAMERAS), INSTRUCTIONS[family])
    return index


def family_counts(batch: dict) -> dict[str, int]:
    families = [family_of(text) for text in batch["instruction"]]
    return {family: families.count(family) for family in INSTRUCTIONS}


def test_the_family_of_an_instruction_is_the_sims_and_other_text_is_one_family():
    assert {family: family_of(text) for family, text in INSTRUCTIONS.items()} == {f: f for f in INSTRUCTIONS}
    assert family_of("fold the towel") == family_of("pick the cube") == OTHER_FAMILY


@pytest.mark.parametrize("episodes", [{"push": 30, "pick": 3, "place": 3}, {"push": 30, "pick": 3}],
                         ids=["three", "two"])
def test_each_family_keeps_its_share_of_every_batch_when_one_family_has_ten_times_the_data(episodes):
    index = index_with(episodes)
    balanced = FamilyBalancedSampler(index, FamilyBalanceConfig())
    plain = FamilyBalancedSampler(index, FamilyBalanceConfig(enabled=False))
    rng_balanced, rng_plain = np.random.default_rng(0), np.random.default_rng(0)
    plain_push = 0
    for _ in range(40):
        batch = balanced.sample(BATCH, RATIOS, SPEC, rng_balanced)
        counts = {family: n for family, n in family_counts(batch).items() if family in episodes}
        assert sum(counts.values()) == BATCH == len(batch["actions"]) == len(batch["stream"])
        # 32 over three families: 10 or 11 samples each (two: 16), the streams still mixed within them
        assert all(BATCH // len(episodes) <= n <= math.ceil(BATCH / len(episodes)) for n in counts.values()), counts
        assert set(batch["stream"].tolist()) > {2}
        plain_push += family_counts(plain.sample(BATCH, RATIOS, SPEC, rng_plain))["push"]
    assert plain_push / (40 * BATCH) > 0.75  # unbalanced, the batches follow the data: 10 of 11 or 12 steps


def test_the_rows_of_a_balanced_batch_stay_together_across_its_tensors():
    """A sample's instruction, state and stream come from the same drawn row."""
    index = index_with({"push": 30, "pick": 3})
    batch = FamilyBalancedSampler(index, FamilyBalanceConfig()).sample(BATCH, RATIOS, SPEC, np.random.default_rng(1))
    # make_steps writes the episode number into state[1]: episodes 1-30 are push, 31-33 pick
    episodes = batch["state"][:, 1].round().int().tolist()
    families = [family_of(text) for text in batch["instruction"]]
    assert [("push" if e <= 30 else "pick") for e in episodes] == families


def test_one_family_draws_exactly_the_unbalanced_batch():
    index = index_with({"push": 4})
    config = FamilyBalanceConfig()
    a = FamilyBalancedSampler(index, config).sample(BATCH, RATIOS, SPEC, np.random.default_rng(3))
    b = index.sample(BATCH, RATIOS, SPEC, np.random.default_rng(3))
    assert a["instruction"] == b["instruction"] and bool((a["state"] == b["state"]).all())


def test_the_trainer_reports_each_familys_share_of_what_it_trained_on(tmp_path):
    index = index_with({"push": 30, "pick": 3, "place": 3}, steps=12)
    trainer = Trainer(tiny_policy(), index, trainer_config(tmp_path, batch_size=12), BC)
    metrics = [trainer.update_once() for _ in range(3)]
    assert all(m is not None and m["family_share/pick"] == pytest.approx(1 / 3) for m in metrics)
    assert trainer.family_samples.counts() == {"pick": 12, "place": 12, "push": 12}
