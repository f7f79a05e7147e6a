"""Task families kept balanced in what the learner trains on.

Why: the robots of a run draw scenes across the task families (pick, push, place), but what is
stored per family is not even: one family's episodes run longer (a place is a pick and a carry),
and the operator takes over most where the policy is weakest. Batches drawn step by step in
proportion to what is stored would teach the policy mostly the family with the most steps, and
the others would be forgotten. Here every family the draws find gets an equal share of each
batch: ``batch_size // families`` samples, one more for ``batch_size % families`` of them drawn
at random, so each family's share of a batch stays within one sample of ``1 / families``.

A step's family is read from its episode's instruction (``hardware.sim.wording.parse``: the sim
words each family's instructions its own way); an instruction that is not one of the sim's
counts as ``OTHER_FAMILY``, so a real robot's single task is one family, sampled exactly as
without balancing.

How: each family's share is drawn by the index from that family's entries alone
(``SamplingIndex.sample`` with ``keep``: the stream ratios, state offsets, frames and the quarantine
of unreadable ones as always, within the family), and the shares are laid end to end: exact shares,
and no sample drawn (its frames read back) only to be thrown away. A family the index holds only in
streams the ratios leave out has no share; the others divide the batch. ``FamilyTally`` reports the
shares trained on. With one family the index's draw is the batch, sample for sample the unbalanced
one.
"""

from __future__ import annotations

import functools
import threading
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from robot_rl.hardware.sim.wording import parse
from robot_rl.learner.config import FamilyBalanceConfig
from robot_rl.learner.index import SampleSpec, SamplingIndex

OTHER_FAMILY = "other"  # the family of every instruction that is not one of the sim's
SHARE_METRIC = "family_share/"  # prefix of each family's share of a batch in the learning metrics


@functools.lru_cache(maxsize=4096)  # few distinct instructions, asked of every entry for every share drawn
def family_of(instruction: str) -> str:
    """The sim task family an instruction asks for, else ``OTHER_FAMILY``."""
    try:
        return parse(instruction)[0]
    except ValueError:
        return OTHER_FAMILY


def family_quotas(families: Sequence[str], batch_size: int, rng: np.random.Generator) -> dict[str, int]:
    """Equal shares of ``batch_size``; the remainder's samples go to families drawn at random."""
    base, extra = divmod(batch_size, len(families))
    lucky = set(rng.choice(len(families), size=extra, replace=False).tolist()) if extra else set()
    return {family: base + (i in lucky) for i, family in enumerate(families)}


class FamilyBalancedSampler:
    """``sample`` is ``SamplingIndex.sample`` with each task family's share of the batch bounded."""

    def __init__(self, index: SamplingIndex, config: FamilyBalanceConfig) -> None:
        self.index = index
        self.config = config
        self._held: tuple[int, list[str]] = (-1, [])  # (entries in the index, their families) when last read

    def held_families(self) -> list[str]:
        """The families of the index's entries, read again only when its number of entries changed: reading
        every entry's instruction under the index's lock for every batch would hold up ingest on a big store."""
        entries = self.index.num_entries
        if entries != self._held[0]:
            self._held = (entries, sorted({family_of(text) for text in self.index.instructions()}))
        return self._held[1]

    def sample(self, batch_size: int, ratios: Mapping[str, float], spec: SampleSpec,
               rng: np.random.Generator) -> dict:
        families = self.held_families() if self.config.enabled else []
        if len(families) < 2:
            return self.index.sample(batch_size, ratios, spec, rng)
        while True:
            quotas = family_quotas(families, batch_size, rng)
            shares, empty = [], []
            for family, quota in quotas.items():
                if quota == 0:  # a batch smaller than the number of families
                    continue
                try:
                    keep = functools.partial(in_family, family)
                    shares.append(self.index.sample(quota, ratios, spec, rng, keep=keep))
                except LookupError:  # none of its steps is in a stream the ratios draw from
                    empty.append(family)
            if not empty:
                return join_batches(shares)
            families = [family for family in families if family not in empty]
            if not families:
                raise LookupError(f"no task family holds steps in the streams with a positive ratio ({dict(ratios)})")


def in_family(family: str, instruction: str) -> bool:
    return family_of(instruction) == family


def join_batches(batches: Sequence[dict]) -> dict:
    """The batches laid end to end (tensors along their first dimension, lists such as the
    instructions item by item)."""
    return {key: torch.cat([b[key] for b in batches]) if isinstance(value, torch.Tensor)
            else [item for b in batches for item in b[key]] for key, value in batches[0].items()}


class FamilyTally:
    """Samples trained on per task family: each batch's shares (learning metrics) and the run's."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, instructions: Sequence[str]) -> dict[str, float]:
        """Count a batch trained on; its families' shares as ``family_share/<family>`` metrics."""
        batch = Counter(family_of(text) for text in instructions)
        with self._lock:
            self._counts.update(batch)
        return {f"{SHARE_METRIC}{family}": n / len(instructions) for family, n in sorted(batch.items())}

    def shares(self) -> dict[str, float]:
        """Each family's share of every sample trained on so far."""
        with self._lock:
            total = sum(self._counts.values())
            return {family: n / total for family, n in sorted(self._counts.items())} if total else {}

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(sorted(self._counts.items()))
