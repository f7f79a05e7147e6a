"""The action queue: the actions planned for the coming ticks, one per tick.

Only the control thread touches it, so it needs no lock: ``take`` is O(1) and never
blocks. Chunks enter through ``splice``, which time-aligns a new chunk with the ticks
that already passed while it was computed (stale actions dropped, or old actions kept
until the new chunk is due) and optionally blends the seam or ensembles the overlap (ACT's
temporal ensembling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from robot_rl.core.types import ActionChunk


@dataclass(frozen=True)
class QueuedAction:
    """One planned action with its provenance (recorded in the Step that executes it)."""

    action: np.ndarray  # what will be commanded (after seam blending, before safety clamps)
    policy_action: np.ndarray  # the raw action the policy predicted
    chunk_id: int
    chunk_index: int
    policy_version: int
    delay_ticks: int
    rolled_state: np.ndarray | None
    predictions: int = 1  # chunks' predictions for this tick that ``action`` averages (temporal ensembling)


class ActionQueue:
    """Planned actions for the next ticks, head first."""

    def __init__(self) -> None:
        self._items: list[QueuedAction] = []
        self._head = 0
        self._last: QueuedAction | None = None

    @property
    def remaining(self) -> int:
        """Actions still planned (not yet taken)."""
        return len(self._items) - self._head

    @property
    def last_taken(self) -> QueuedAction | None:
        """The action taken most recently; its chunk_index is the executed index k."""
        return self._last

    def pending(self) -> list[QueuedAction]:
        """A copy of the planned actions, head first (for inspection and tests)."""
        return self._items[self._head :]

    def take(self) -> QueuedAction | None:
        """Pop the head for this tick; None when nothing is planned (caller holds)."""
        if self._head >= len(self._items):
            return None
        item = self._items[self._head]
        self._head += 1
        self._last = item
        return item

    def planned_target(self, ticks_ahead: int) -> np.ndarray | None:
        """The target that will be commanded after ``ticks_ahead`` more ticks.

        With the current chunk at executed index k this is chunk[k + ticks_ahead]; past
        the end of the plan it is the last planned action, because the robot then holds
        it. ``ticks_ahead=0`` is the current commanded target. None if nothing was ever
        planned (the caller uses the measured state).
        """
        if ticks_ahead < 0:
            raise ValueError(f"ticks_ahead must be >= 0, got {ticks_ahead}")
        if ticks_ahead > 0 and self.remaining > 0:
            index = self._head + min(ticks_ahead, self.remaining) - 1
            return self._items[index].action
        return None if self._last is None else self._last.action

    def clear(self) -> None:
        """Forget the plan and the last taken action (new episode)."""
        self._items = []
        self._head = 0
        self._last = None

    def splice(
        self,
        chunk: ActionChunk,
        *,
        stale: int = 0,
        keep: int = 0,
        limit: int | None = None,
        blend_ticks: int = 0,
        hold: np.ndarray | None = None,
        ensemble_coeff: float | None = None,
    ) -> int:
        """Replace the plan with ``chunk``; return how many of its actions were queued.

        stale: leading actions of the chunk whose tick already passed; dropped, so the
            next action taken is chunk[stale].
        keep: old planned actions still to execute before the chunk is due (the chunk
            arrived earlier than the delay it was rolled forward by). Capped by what is
            left of the old plan: the new chunk then starts as soon as the old one ends.
        limit: only chunk indices < limit are queued (sync mode's execution horizon).
        blend_ticks: the first queued chunk actions are blended linearly with what the old
            plan would have commanded at those ticks (or ``hold`` once it runs out), so
            the seam has no step.
        hold: the currently commanded position, the blend's fallback.
        ensemble_coeff: temporal ensembling instead of replacing: each queued chunk action
            averages in what the old plan holds for its tick (``_ensemble``).
        """
        if stale < 0 or keep < 0:
            raise ValueError(f"stale and keep must be >= 0, got stale={stale} keep={keep}")
        if stale and keep:
            raise ValueError("a chunk cannot both be late (stale > 0) and early (keep > 0)")
        old = self.pending()
        kept, replaced = old[:keep], old[keep:]
        end = chunk.horizon if limit is None else min(limit, chunk.horizon)
        new = [self._entry(chunk, i) for i in range(stale, end)]
        if blend_ticks and new:
            anchor = kept[-1].action if kept else hold
            if anchor is None and self._last is not None:
                anchor = self._last.action
            new = _blend(new, replaced, anchor, blend_ticks)
        if ensemble_coeff is not None:
            new = _ensemble(new, replaced, ensemble_coeff)
        self._items = kept + new
        self._head = 0
        return len(new)

    @staticmethod
    def _entry(chunk: ActionChunk, index: int) -> QueuedAction:
        action = chunk.actions[index]
        return QueuedAction(
            action=action,
            policy_action=action,
            chunk_id=chunk.chunk_id,
            chunk_index=index,
            policy_version=chunk.policy_version,
            delay_ticks=chunk.delay_ticks,
            rolled_state=chunk.rolled_state,
        )


def _ensemble(new: list[QueuedAction], old: list[QueuedAction], coeff: float) -> list[QueuedAction]:
    """ACT's temporal ensembling, tick by tick: the old plan's action for a tick averages ``c`` earlier
    predictions, the new one is the (c+1)-th, weighted exp(-coeff * c) against their weights
    exp(-coeff * i), i < c: LeRobot's online update (``ACTTemporalEnsembler.update``). Its class is
    not used as it is: it takes one chunk every tick, each starting at that tick, while here a chunk
    lands after a measured delay, possibly stale or early, and the queue has aligned it already."""
    out = list(new)
    for j, (fresh, planned) in enumerate(zip(new, old, strict=False)):
        c = planned.predictions
        earlier = sum(math.exp(-coeff * i) for i in range(c))
        weight = math.exp(-coeff * c)
        action = ((planned.action * earlier + fresh.action * weight) / (earlier + weight)).astype(np.float32)
        out[j] = replace(fresh, action=action, predictions=c + 1)
    return out


def _blend(
    new: list[QueuedAction], old: list[QueuedAction], anchor: np.ndarray | None, blend_ticks: int
) -> list[QueuedAction]:
    """Weights (j+1)/(B+1) on the new chunk for its j-th queued action, j < B.

    The reference at each tick is what the old plan would have commanded then, or the
    last old target once it runs out (the robot would have held it).
    """
    out = list(new)
    for j in range(min(blend_ticks, len(new))):
        if j < len(old):
            ref = old[j].action
        elif old:
            ref = old[-1].action
        elif anchor is not None:
            ref = anchor
        else:
            break  # nothing was ever commanded: nothing to blend from
        w = (j + 1) / (blend_ticks + 1)
        blended = ((1.0 - w) * ref + w * new[j].action).astype(np.float32)
        out[j] = replace(new[j], action=blended)
    return out
