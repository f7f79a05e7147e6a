"""Instruction wordings: each keeps the task's colour and direction, and eval feeds them to the policy."""

from __future__ import annotations

import numpy as np
import pytest

from robot_rl.app.evaluation import evaluate_on_scenes, seed_scenes
from robot_rl.config import ConfigError, load_config
from robot_rl.edge import EdgeConfig
from robot_rl.hardware.sim.tasks import PUSH_DIRECTIONS, TASK_COLORS, TASK_FAMILIES, make_task
from robot_rl.hardware.sim.wording import COLOUR_SYNONYMS, WORDINGS, parse, reword
from tests.test_replay import make_robot

TRAINED = [make_task(family, color, direction).instruction for family in TASK_FAMILIES for color in TASK_COLORS
           for direction in PUSH_DIRECTIONS]


@pytest.mark.parametrize("instruction", sorted(set(TRAINED)))
def test_every_wording_keeps_what_the_task_asks_and_changes_how_it_is_said(instruction):
    family, slots = parse(instruction)
    assert reword(instruction, "trained") == instruction
    for index in range(3):
        paraphrase = reword(instruction, "paraphrase", index)
        assert paraphrase != instruction and slots["color"] in paraphrase.split()
        assert slots.get("direction", "") in paraphrase
    reordered = reword(instruction, "reordered")
    assert reordered != instruction and not reordered.startswith(instruction.split()[0])  # the goal comes first
    assert all(word in reordered.replace(",", "").replace(":", "").split() for word in slots.values())
    recoloured = reword(instruction, "colour_words")
    assert slots["color"] not in recoloured.split() and COLOUR_SYNONYMS[slots["color"]] in recoloured.split()
    assert recoloured.replace(COLOUR_SYNONYMS[slots["color"]], slots["color"]) == instruction


def test_text_that_is_no_sim_instruction_and_unknown_wordings_are_refused():
    with pytest.raises(ValueError, match="not one of the sim's instructions"):
        reword("wave hello", "paraphrase")
    with pytest.raises(ValueError, match="unknown wording"):
        reword(TRAINED[0], "shouted")
    with pytest.raises(ConfigError, match="eval.wording"):
        load_config(["eval.wording=shouted"])
    assert set(WORDINGS) == {"trained", "paraphrase", "reordered", "colour_words"}


class RecordingHold:
    """Holds the arm and remembers every instruction it was asked with."""

    chunk_size, action_dim = 5, 6

    def __init__(self) -> None:
        self.instructions: list[str] = []

    def predict_chunk(self, observation, state, instruction):
        self.instructions.append(instruction)
        return np.repeat(np.asarray(state, dtype=np.float32)[None], self.chunk_size, axis=0)


def test_eval_gives_the_policy_the_reworded_instruction_on_the_same_scene():
    robot = make_robot()
    edge = EdgeConfig(mode="async_rollforward", simulated_latency_ms=0.0, inference_runner="virtual")
    scenes = seed_scenes(2, 100, ["push"])
    try:
        seen = {}
        for wording in ("trained", "reordered"):
            policy = RecordingHold()
            evaluate_on_scenes(robot, policy, edge, scenes, wording, max_steps=6, progress=False, wording=wording)
            seen[wording] = sorted(set(policy.instructions))
    finally:
        robot.disconnect()
    assert len(seen["trained"]) >= 1 and all(text.startswith("push the") for text in seen["trained"])
    assert seen["reordered"] == sorted(reword(text, "reordered") for text in seen["trained"])
