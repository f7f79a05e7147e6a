"""`robot-rl keys`: CURVE key generation (issue #4, not built yet)."""

from __future__ import annotations

from robot_rl.commands.not_yet import not_yet_built


def main(argv: list[str]) -> int:
    return not_yet_built("keys", 4, "CURVE key generation")
