"""`robot-rl session`: the operator session on real robots (issue #6, not built yet)."""

from __future__ import annotations

from robot_rl.commands.not_yet import not_yet_built


def main(argv: list[str]) -> int:
    return not_yet_built("session", 6, "the operator session on real robots")
