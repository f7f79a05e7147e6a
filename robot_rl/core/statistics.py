"""The statistics of a success rate: its Wilson interval, and two policies on the same scenes.

A success rate over n scenes gets the Wilson score interval: honest at small n and at 0 % or 100 %.

Two policies on the same scenes: by how much is one better, and could it be luck?

Why paired: on a shared scene set (same seeds, same flow noise) most scenes are solved, or
failed, by both policies and say nothing about the difference. Only the discordant scenes, the
ones a single policy solves, do. The exact McNemar test (a two-sided sign test on them) is
therefore far sharper than two side-by-side Wilson intervals: at 80 scenes and ~90 % success
those overlap for any difference under ~15 points, while 9 scenes won by one policy and 1 by
the other are already p = 0.02.

The interval on the difference is Newcombe's (1998, method 10): the two Wilson intervals combined
with the correlation of the paired outcomes, so it stays inside [-1, 1], is honest near 100 %
and narrows, as the test does, when the two policies fail on the same scenes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import sqrt


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of ``successes`` out of ``n``."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass(frozen=True)
class PairedComparison:
    """Policy A against policy B, scene by scene."""

    scenes: int
    a_success: float
    b_success: float
    only_a: int  # scenes A solved and B failed
    only_b: int  # scenes B solved and A failed
    p_value: float  # exact two-sided McNemar: the chance of a split this uneven if A and B were alike
    difference_ci95: tuple[float, float]  # of a_success - b_success (Newcombe's paired interval)

    @property
    def difference(self) -> float:
        return self.a_success - self.b_success

    def describe(self, a_name: str = "the first", b_name: str = "the second") -> str:
        """E.g. "+10.0 points (95% CI +2..+19; 9 scenes only the first solved, 1 only the second;
        exact McNemar p = 0.021)"."""
        lo, hi = self.difference_ci95
        return (f"{100 * self.difference:+.1f} points (95% CI {100 * lo:+.0f}..{100 * hi:+.0f}; {self.only_a} scenes "
                f"only {a_name} solved, {self.only_b} only {b_name}; exact McNemar p = {self.p_value:.2g})")

    @classmethod
    def from_dict(cls, data: dict) -> PairedComparison:
        """The inverse of ``as_dict`` (e.g. read back from a summary.json)."""
        return cls(scenes=int(data["scenes"]), a_success=float(data["a_success"]), b_success=float(data["b_success"]),
                   only_a=int(data["only_a"]), only_b=int(data["only_b"]), p_value=float(data["p_value"]),
                   difference_ci95=(float(data["difference_ci95"][0]), float(data["difference_ci95"][1])))

    def as_dict(self) -> dict:
        return {"scenes": self.scenes, "a_success": self.a_success, "b_success": self.b_success,
                "difference": self.difference, "difference_ci95": list(self.difference_ci95),
                "only_a": self.only_a, "only_b": self.only_b, "p_value": self.p_value}


def compare_paired(a_wins: Sequence[bool], b_wins: Sequence[bool]) -> PairedComparison:
    """``a_wins[i]`` / ``b_wins[i]``: did A / B solve scene i (the same scene for both)."""
    from scipy.stats import binomtest  # the learner's extra; an edge never compares policies
    a, b = [bool(x) for x in a_wins], [bool(x) for x in b_wins]
    if len(a) != len(b):
        raise ValueError(f"a paired comparison needs the same scenes for both policies: {len(a)} against {len(b)}")
    if not a:
        raise ValueError("a paired comparison needs at least one scene")
    n = len(a)
    both = sum(x and y for x, y in zip(a, b, strict=True))
    only_a = sum(x and not y for x, y in zip(a, b, strict=True))
    only_b = sum(y and not x for x, y in zip(a, b, strict=True))
    discordant = only_a + only_b
    p_value = 1.0 if discordant == 0 else float(binomtest(only_a, discordant, 0.5).pvalue)
    return PairedComparison(scenes=n, a_success=(both + only_a) / n, b_success=(both + only_b) / n,
                            only_a=only_a, only_b=only_b, p_value=p_value,
                            difference_ci95=_newcombe_interval(both, only_a, only_b, n - discordant - both))


def _newcombe_interval(both: int, only_a: int, only_b: int, neither: int) -> tuple[float, float]:
    """95 % interval of P(A) - P(B) from the paired 2x2 table (Newcombe 1998, method 10)."""
    n = both + only_a + only_b + neither
    p1, p2 = (both + only_a) / n, (both + only_b) / n
    (l1, u1), (l2, u2) = wilson_interval(both + only_a, n), wilson_interval(both + only_b, n)
    margins = (both + only_a) * (only_b + neither) * (both + only_b) * (only_a + neither)
    phi = (both * neither - only_a * only_b) / sqrt(margins) if margins else 0.0
    below = sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    above = sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return max(-1.0, p1 - p2 - below), min(1.0, p1 - p2 + above)
