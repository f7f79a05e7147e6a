"""Subcommands whose capability is owned by an open issue say so instead of pretending."""

from __future__ import annotations

import sys


def not_yet_built(command: str, issue: int, what: str) -> int:
    print(
        f"robot-rl {command}: not built yet — {what} is issue #{issue}. "
        "See README.md for what works today.",
        file=sys.stderr,
    )
    return 2
