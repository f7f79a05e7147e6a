"""Instruction augmentation: train on several wordings of each instruction, so a policy follows words.

A policy that only ever reads "push the red cube to the left" learns that string, not what its
words mean: another verb, order or colour name is text it never saw (``eval.wording`` measures
this, BENCHMARKS.md "instruction wording"). With augmentation a training sample reads, with
probability ``p``, one of its instruction's other wordings instead; the images, state and
target chunk stay the same, so the target says the wordings mean one task.

Where the wordings come from (``InstructionVariants.load``):

* ``"sim"``: the sim's training wordings (``robot_rl.hardware.sim.wording.training_variants``),
  which share no template with the evaluation wordings;
* ``"package.module:function"``: any function from an instruction to a tuple of its wordings
  (``"sim"`` names one; imported by name when training starts, so this package, which the sim
  builds on, never imports the sim);
* a YAML file mapping each instruction to a list of its wordings, for a lab's own tasks.

An instruction with no entry keeps its wording. One uniform draw per sample decides both
whether it is reworded and which wording it reads, so a resumed learner and data-parallel
ranks reproduce the same choice from the algorithm's generator.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import yaml

ALIASES = {"sim": "robot_rl.hardware.sim.wording:training_variants"}


class InstructionVariants:
    """Other wordings per instruction, and the probability that a training sample reads one."""

    def __init__(self, variants_of: Callable[[str], tuple[str, ...]], probability: float):
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"instruction_augmentation must be in [0, 1], got {probability}")
        self._variants_of = variants_of
        self.probability = probability

    @classmethod
    def load(cls, source: str, probability: float) -> InstructionVariants:
        """``"sim"``, ``"module:function"`` or the path of a YAML file ``{instruction: [wording, ...]}``."""
        source = ALIASES.get(source, source)
        if not Path(source).is_file() and ":" in source:
            return cls(_function(source), probability)
        table = _read_table(Path(source))
        return cls(lambda instruction: table.get(instruction, ()), probability)

    def variants(self, instruction: str) -> tuple[str, ...]:
        return self._variants_of(instruction)

    def all_wordings(self, instructions: Sequence[str]) -> list[str]:
        """Every instruction and every wording of it, each once (what the encoder's statistics should see)."""
        out = dict.fromkeys(instructions)
        for instruction in instructions:
            out.update(dict.fromkeys(self.variants(instruction)))
        return list(out)

    def reword(self, instructions: Sequence[str], draws: torch.Tensor) -> list[str]:
        """Each instruction, or one of its wordings where its draw (uniform in [0, 1)) is below ``probability``."""
        if len(draws) != len(instructions):
            raise ValueError(f"{len(instructions)} instructions but {len(draws)} draws")
        out = []
        for instruction, draw in zip(instructions, draws.tolist(), strict=True):
            options = self.variants(instruction)
            if options and draw < self.probability:
                out.append(options[min(int(draw / self.probability * len(options)), len(options) - 1)])
            else:
                out.append(instruction)
        return out


def _function(source: str) -> Callable[[str], tuple[str, ...]]:
    module_name, _, name = source.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"instruction_variants: cannot import {source!r} ({e})") from e

    def variants_of(instruction: str) -> tuple[str, ...]:
        try:
            return tuple(function(instruction))
        except ValueError:  # an instruction the function does not know (typed in a session): kept as it is
            return ()

    return variants_of


def _read_table(path: Path) -> dict[str, tuple[str, ...]]:
    if not path.is_file():
        raise ValueError(f"instruction_variants: {path} is not a file; give 'sim', 'module:function' or a "
                         "YAML file mapping each instruction to a list of its wordings")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"instruction_variants: {path} is not valid YAML: {e}") from e
    if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and v and all(isinstance(w, str) and w for w in v)
            for k, v in data.items()):
        raise ValueError(f"instruction_variants: {path} must map each instruction (a string) to a non-empty "
                         "list of its wordings (strings)")
    return {k: tuple(v) for k, v in data.items()}
