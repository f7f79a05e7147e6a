"""How many PyTorch threads the trainer gets once the robots have stopped: as many as are fastest, measured.

Why measured: PyTorch's intra-op threads wait for each other at every op. On a core that another
process also wants (the dataset writer catching up, a second job, a browser), the thread that
shares it falls behind and its partners wait for it: on a two-core CPU box two threads then ran an
update 10-15x slower than one. Whether that happens depends on what else runs, which changes during
a run, so ``ThreadChoice`` tries each count from the most the cores allow (``most_threads``) down to one,
``window_s`` each, keeps the fastest, and tries them again every ``hold_s``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


def most_threads(cores: int, episodes_to_write: int) -> int:
    """Every core, but one fewer while the dataset writer still has episodes to write: the writer then
    holds a core, and a trainer thread sharing it waits at every op for its slice of it."""
    return max(cores - (episodes_to_write > 0), 1)


@dataclass
class ThreadChoice:
    """Chooses the trainer's thread count from measured updates/s (see the module doc).

    >>> choice = ThreadChoice()
    >>> threads = choice.threads(now_s, trainer.step, most_threads(cores, backlog))  # every poll
    """

    window_s: float = 5.0  # each count is measured this long (a few updates even on a slow CPU)
    hold_s: float = 60.0  # the fastest is kept this long, then all are measured again
    _most: int = field(default=0, init=False)  # the most threads allowed at the last call
    _trying: int = field(default=0, init=False)  # the count being measured; 0: holding ``_chosen``
    _chosen: int = field(default=0, init=False)
    _started_s: float = field(default=0.0, init=False)  # when the count in use was set ...
    _started_step: int = field(default=0, init=False)  # ... and the trainer's update count then
    _rates: dict[int, float] = field(default_factory=dict, init=False)  # updates/s by threads, this round

    def threads(self, now_s: float, step: int, most: int) -> int:
        """The count to train with from now on, given the clock, the trainer's update count and the most
        threads the cores allow now."""
        if most != self._most:  # the first call, or the writer caught up: measure every count again
            self._most = most
            return self._try(most, now_s, step, fresh=True)
        elapsed = now_s - self._started_s
        if self._trying:
            if elapsed < self.window_s:
                return self._trying
            self._rates[self._trying] = (step - self._started_step) / elapsed
            if self._trying > 1:
                return self._try(self._trying - 1, now_s, step)
            return self._hold(now_s, step)
        if elapsed >= self.hold_s:
            return self._try(self._most, now_s, step, fresh=True)
        return self._chosen

    def _try(self, threads: int, now_s: float, step: int, fresh: bool = False) -> int:
        if fresh:
            self._rates = {}
        self._trying, self._started_s, self._started_step = threads, now_s, step
        return threads

    def _hold(self, now_s: float, step: int) -> int:
        chosen = max(self._rates, key=lambda n: (self._rates[n], n))
        if chosen != self._chosen:
            rates = ", ".join(f"{n}: {rate:.2f}" for n, rate in sorted(self._rates.items(), reverse=True))
            log.info("training on %d PyTorch thread(s), the fastest measured (updates/s by threads: %s)",
                     chosen, rates)
        self._chosen, self._trying, self._started_s, self._started_step = chosen, 0, now_s, step
        return chosen
