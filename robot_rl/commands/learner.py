"""`robot-rl learner`: the learner service (issue #4, not built yet)."""

from __future__ import annotations

from robot_rl.commands.not_yet import not_yet_built


def main(argv: list[str]) -> int:
    return not_yet_built("learner", 4, "the learner service")
