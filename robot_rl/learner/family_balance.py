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

How: the index draws batches as it always does (``SamplingIndex.sample``: the stream ratios,
state offsets, frames, the quarantine of unreadable ones), and the sampler keeps from them each
family's share, drawing again, at most ``max_draws`` batches in all, until every family the index
holds has its share (balanced data: two draws a batch; a family with a twelfth of the steps: about
five). A family too rare to fill its share in that many draws (or held only in a stream the ratios
leave out) keeps what was found and the others fill the batch; ``FamilyTally`` reports the shares
trained on, so that shows. With one family the index's draw is the batch, sample for sample the
unbalanced one.
"""

from __future__ import annotations

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
        held = self.held_families() if self.config.enabled else []
        if len(held) < 2:
            return self.index.sample(batch_size, ratios, spec, rng)
        quotas = family_quotas(held, batch_size, rng)
        draws: list[dict] = []
        families: list[str] = []  # of every row drawn, in draw order
        while len(draws) < self.config.max_draws:
            draws.append(self.index.sample(batch_size, ratios, spec, rng))
            families += [family_of(text) for text in draws[-1]["instruction"]]
            counts = Counter(families)
            if all(counts[family] >= quota for family, quota in quotas.items()):
                break
        found = sorted(set(families))
        if found != held:  # a family the draws never met (e.g. only in a stream the ratios leave out)
            quotas = family_quotas(found, batch_size, rng)
        return take_rows(draws, balanced_rows(families, quotas))


def balanced_rows(families: Sequence[str], quotas: Mapping[str, int]) -> list[int]:
    """Which of the drawn rows (``families[i]``: row i's family) make the batch: each family's first
    ``quotas[family]`` rows, and where a family has fewer, the next rows of the others in draw
    order; in draw order."""
    taken: Counter[str] = Counter()
    chosen, spare = [], []
    for row, family in enumerate(families):
        if taken[family] < quotas.get(family, 0):
            taken[family] += 1
            chosen.append(row)
        else:
            spare.append(row)
    short = sum(quotas.values()) - len(chosen)
    return sorted(chosen + spare[:short])


def take_rows(draws: Sequence[dict], rows: Sequence[int]) -> dict:
    """The batch of ``rows`` of the ``draws`` laid end to end (tensors by their first dimension,
    lists such as the instructions item by item)."""
    if len(draws) == 1 and list(rows) == list(range(len(draws[0]["instruction"]))):
        return draws[0]
    picked = torch.as_tensor(rows, dtype=torch.int64)
    batch: dict = {}
    for key, value in draws[0].items():
        if isinstance(value, torch.Tensor):
            batch[key] = torch.cat([d[key] for d in draws]).index_select(0, picked)
        else:
            joined = [item for d in draws for item in d[key]]
            batch[key] = [joined[row] for row in rows]
    return batch


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
