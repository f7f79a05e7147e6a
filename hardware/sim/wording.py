"""Other wordings of the sim's instructions, for measuring how well a policy follows language.

A policy trained on one template per family ("push the red cube to the left") may have learned
the template rather than the words. Each variant keeps the task (same scene, same success test)
and changes only what the policy reads:

* ``trained``: the instruction as the tasks write it (``robot_rl.hardware.sim.tasks.make_task``);
* ``paraphrase``: other verbs and nouns, the same order of information ("shove the red block
  to the left");
* ``reordered``: the same words, the goal first ("to the left, push the red cube");
* ``colour_words``: other names of the same colours ("push the crimson cube to the left").

Paraphrases rotate over a few per family by the episode's index, so a set of scenes sees each.

``training_table`` gives *other* wordings for training-time instruction augmentation
(``policy.model.instruction_variants=sim``): other verbs, nouns, orders and colour names than
every wording above, so an evaluation with ``eval.wording`` still reads text the policy never
trained on.
"""

from __future__ import annotations

import re

WORDINGS: tuple[str, ...] = ("trained", "paraphrase", "reordered", "colour_words")

_PUSH = re.compile(r"^push the (\w+) cube to the (\w+)$")
_PICK = re.compile(r"^pick up the (\w+) cube$")
_PLACE = re.compile(r"^put the (\w+) cube in the bowl$")

_PARAPHRASES = {
    "push": ("shove the {color} block to the {direction}", "slide the {color} cube over to the {direction}",
             "move the {color} cube {direction}wards by pushing it"),
    "pick": ("lift the {color} block", "grab the {color} cube and raise it", "take the {color} cube up"),
    "place": ("drop the {color} block into the bowl", "move the {color} cube into the bowl",
              "place the {color} cube inside the bowl"),
}
_REORDERED = {
    "push": "to the {direction}, push the {color} cube",
    "pick": "the {color} cube: pick it up",
    "place": "in the bowl, put the {color} cube",
}
_TRAINED = {
    "push": "push the {color} cube to the {direction}",
    "pick": "pick up the {color} cube",
    "place": "put the {color} cube in the bowl",
}
COLOUR_SYNONYMS = {"red": "crimson", "green": "emerald", "blue": "navy"}

# Training wordings: none of their verbs, nouns or orders is an evaluation wording's above.
_TRAINING_TEMPLATES = {
    "push": ("nudge the {color} cube to the {direction}", "push the {color} box {direction}",
             "the {color} cube should end up on the {direction}", "shift the {color} cube toward the {direction}",
             "{direction} side: that is where the {color} cube must be pushed"),
    "pick": ("pick the {color} box up", "raise the {color} cube", "the {color} cube: lift it off the table",
             "get the {color} cube up in the air"),
    "place": ("set the {color} cube into the bowl", "the bowl is where the {color} box goes",
              "carry the {color} cube to the bowl and drop it", "put the {color} box in the bowl"),
}
_TRAINING_COLOUR_NAMES = {"red": ("red", "scarlet", "ruby"), "green": ("green", "lime", "jade"),
                          "blue": ("blue", "azure", "cobalt")}


def parse(instruction: str) -> tuple[str, dict[str, str]]:
    """(family, {colour, direction}) of a sim instruction; ValueError for any other text."""
    for family, pattern, names in (("push", _PUSH, ("color", "direction")), ("pick", _PICK, ("color",)),
                                   ("place", _PLACE, ("color",))):
        match = pattern.match(instruction)
        if match:
            return family, dict(zip(names, match.groups(), strict=True))
    raise ValueError(f"{instruction!r} is not one of the sim's instructions; wordings apply to sim tasks only")


def reword(instruction: str, wording: str, index: int = 0) -> str:
    """``instruction`` in ``wording`` (one of ``WORDINGS``); ``index`` picks among the paraphrases."""
    if wording not in WORDINGS:
        raise ValueError(f"unknown wording {wording!r}; choose one of {WORDINGS}")
    if wording == "trained":
        return instruction
    family, slots = parse(instruction)
    if wording == "paraphrase":
        options = _PARAPHRASES[family]
        return options[index % len(options)].format(**slots)
    if wording == "reordered":
        return _REORDERED[family].format(**slots)
    return _TRAINED[family].format(**{**slots, "color": COLOUR_SYNONYMS[slots["color"]]})


def training_variants(instruction: str) -> tuple[str, ...]:
    """Wordings of a sim ``instruction`` to train on (every template with every training colour name)."""
    family, slots = parse(instruction)
    return tuple(template.format(**{**slots, "color": name})
                 for template in _TRAINING_TEMPLATES[family] for name in _TRAINING_COLOUR_NAMES[slots["color"]])

