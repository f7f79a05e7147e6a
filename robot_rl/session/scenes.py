"""Which scene each session episode is set up in.

The sim sets up a scene from a seed and a task family; a real robot's scene is whatever the
operator put on the table, so it has neither (its episodes are recorded without a seed, and
replay does not pretend to re-create them). Sim sessions draw a fresh base seed unless
``session.seed`` fixes one, so two sessions do not practise on the same scenes; families
(``task_families``) rotate over the episodes. A rerecord sets up the same scene again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Scene:
    seed: int | None  # None: a real scene, not re-creatable
    family: str | None = None  # None: the sim draws one from the seed


class SceneDraw:
    """``next()`` gives the next episode's scene; ``next(same=True)`` the last one again."""

    def __init__(self, base_seed: int | None, families: Sequence[str] | None = None) -> None:
        self.base_seed = base_seed
        self.families = tuple(families) if families else None
        self._drawn = 0
        self._last = Scene(None)

    @classmethod
    def for_sim(cls, seed: int | None, families: Sequence[str] | None) -> SceneDraw:
        """A sim session's scenes: from ``seed`` on, or from a base drawn from the clock."""
        return cls(seed if seed is not None else time.time_ns() // 1000 % (2**31 - 1_000_000), families)

    def next(self, same: bool = False) -> Scene:
        if same and self._drawn:
            return self._last
        if self.base_seed is None:
            self._last = Scene(None)
        else:
            family = self.families[self._drawn % len(self.families)] if self.families else None
            self._last = Scene(self.base_seed + self._drawn, family)
        self._drawn += 1
        return self._last
