"""`robot-rl replay`: dataset replay in the sim (issue #7, not built yet)."""

from __future__ import annotations

from robot_rl.commands.not_yet import not_yet_built


def main(argv: list[str]) -> int:
    return not_yet_built("replay", 7, "dataset replay in the sim")
