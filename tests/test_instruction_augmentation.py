"""Instruction augmentation: training wordings stay apart from the evaluation's, and FlowVLA reads them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from robot_rl.hardware.sim.tasks import PUSH_DIRECTIONS, TASK_COLORS, TASK_FAMILIES, make_task
from robot_rl.hardware.sim.wording import WORDINGS, parse, reword, training_variants
from robot_rl.policies.flow_vla import FlowVLA, FlowVLAConfig
from robot_rl.policies.text_encoder import InstructionEncoder
from robot_rl.policies.wordings import InstructionVariants
from tests.learner_helpers import hashed_embeddings
from tests.test_flow_vla import random_batch, tiny_config

SIM_INSTRUCTIONS = sorted({make_task(family, color, direction).instruction for family in TASK_FAMILIES
                           for color in TASK_COLORS for direction in PUSH_DIRECTIONS})


@pytest.mark.parametrize("instruction", SIM_INSTRUCTIONS)
def test_training_wordings_keep_the_task_and_share_no_text_with_any_evaluation_wording(instruction):
    evaluated = {reword(instruction, wording, index) for wording in WORDINGS for index in range(6)}
    variants = training_variants(instruction)
    assert len(set(variants)) == len(variants) >= 10
    assert not set(variants) & evaluated, "a training wording is one the evaluation measures"
    _, slots = parse(instruction)
    other_colours = {"red": ("green", "lime", "jade", "blue", "azure", "cobalt"),
                     "green": ("red", "scarlet", "ruby", "blue", "azure", "cobalt"),
                     "blue": ("red", "scarlet", "ruby", "green", "lime", "jade")}[slots["color"]]
    for variant in variants:
        words = variant.replace(":", "").split()
        assert not set(words) & set(other_colours), f"{variant!r} names another cube"
        if "direction" in slots:
            assert slots["direction"] in words and ({"left", "right"} - {slots["direction"]}).isdisjoint(words)


def test_a_draw_below_the_probability_picks_a_wording_and_one_above_keeps_the_instruction():
    variants = InstructionVariants(lambda s: ("a", "b") if s == "known" else (), probability=0.5)
    draws = torch.tensor([0.0, 0.26, 0.49, 0.5, 0.99, 0.1])
    assert variants.reword(["known"] * 5 + ["unknown"], draws) == ["a", "b", "b", "known", "known", "unknown"]
    assert InstructionVariants(lambda s: ("a",), 0.0).reword(["known"], torch.tensor([0.0])) == ["known"]
    assert variants.all_wordings(["known", "unknown", "known"]) == ["known", "unknown", "a", "b"]
    with pytest.raises(ValueError, match="2 instructions but 1 draws"):
        variants.reword(["known", "known"], torch.tensor([0.0]))
    with pytest.raises(ValueError, match=r"instruction_augmentation must be in \[0, 1\]"):
        FlowVLAConfig(instruction_augmentation=1.5)


def test_a_lab_table_is_read_from_yaml_and_a_bad_one_is_refused_by_name(tmp_path):
    table = tmp_path / "wordings.yaml"
    table.write_text("wipe the table:\n  - clean the table\n  - wipe down the tabletop\n")
    variants = InstructionVariants.load(str(table), probability=1.0)
    assert variants.variants("wipe the table") == ("clean the table", "wipe down the tabletop")
    assert variants.reword(["wipe the table", "fold"], torch.tensor([0.75, 0.0])) == ["wipe down the tabletop", "fold"]
    for text in ("wipe the table: clean it\n", "- a list\n", "wipe the table: []\n", "a: [b\n"):
        table.write_text(text)
        with pytest.raises(ValueError, match="wordings.yaml"):
            InstructionVariants.load(str(table), probability=1.0)
    with pytest.raises(ValueError, match="is not a file; give 'sim'"):
        InstructionVariants.load(str(tmp_path / "missing.yaml"), probability=1.0)
    with pytest.raises(ValueError, match="cannot import 'robot_rl.nowhere:variants'"):
        InstructionVariants.load("robot_rl.nowhere:variants", probability=1.0)


def test_sim_names_the_sims_training_wordings_and_leaves_other_text_alone():
    variants = InstructionVariants.load("sim", probability=1.0)
    assert variants.variants("push the red cube to the left") == training_variants("push the red cube to the left")
    assert variants.variants("wipe the table") == ()


def augmented_model(tmp_path, encoded: list[str], **overrides) -> FlowVLA:
    table = tmp_path / "wordings.yaml"
    table.write_text("task 0: [first wording of task 0, second wording of task 0]\n")
    torch.manual_seed(0)
    encoder = InstructionEncoder(backend=lambda texts: encoded.extend(texts) or hashed_embeddings(texts))
    return FlowVLA(tiny_config(instruction_variants=str(table), instruction_augmentation=1.0, **overrides),
                   text_encoder=encoder).eval()


def test_flow_vla_trains_on_the_drawn_wording_and_its_statistics_cover_every_wording(tmp_path):
    encoded: list[str] = []
    model = augmented_model(tmp_path, encoded, normalize_instruction=True)
    rng = np.random.default_rng(0)
    model.fit_statistics(rng.standard_normal((50, 6)), rng.standard_normal((50, 6)), ["task 0", "task 1"])
    assert set(encoded) == {"task 0", "task 1", "first wording of task 0", "second wording of task 0"}

    batch = random_batch(4)  # instructions: task 0, task 1, task 0, task 1
    randomness = model.draw_training_randomness(4, torch.Generator().manual_seed(1))
    assert randomness["wording_draw"].shape == (4,)
    reworded, _ = model.compute_loss(batch, **{**randomness, "wording_draw": torch.zeros(4)})
    kept, _ = model.compute_loss(batch, **{**randomness, "wording_draw": torch.ones(4)})
    plain, _ = model.compute_loss(batch, noise=randomness["noise"], flow_time=randomness["flow_time"])
    assert torch.equal(kept, plain) and not torch.allclose(reworded, plain)
    # The same generator state gives the same update: a resumed learner rewords the same samples.
    again = model.draw_training_randomness(4, torch.Generator().manual_seed(1))
    assert torch.equal(again["wording_draw"], randomness["wording_draw"])


def test_without_augmentation_the_randomness_and_the_statistics_are_as_before(tmp_path):
    encoded: list[str] = []
    model = FlowVLA(tiny_config(normalize_instruction=True),
                    text_encoder=InstructionEncoder(backend=lambda t: encoded.extend(t) or hashed_embeddings(t)))
    assert set(model.draw_training_randomness(2, torch.Generator())) == {"noise", "flow_time"}
    rng = np.random.default_rng(0)
    model.fit_statistics(rng.standard_normal((50, 6)), rng.standard_normal((50, 6)), ["task 0", "task 1"])
    assert sorted(encoded) == ["task 0", "task 1"]
    assert model.instruction_variants is None


def test_a_missing_table_is_refused_when_training_starts_and_never_read_for_inference(tmp_path):
    missing = str(tmp_path / "gone.yaml")
    model = FlowVLA(tiny_config(instruction_variants=missing),
                    text_encoder=InstructionEncoder(backend=hashed_embeddings))
    model.eval()
    assert model.predict_chunk({"front": np.zeros((16, 16, 3), np.uint8)}, np.zeros(6, np.float32), "task 0").shape
    with pytest.raises(ValueError, match="gone.yaml is not a file"):
        model.train()
