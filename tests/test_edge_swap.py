"""The double-buffer rule of the weight swap (robot_rl.edge.swap.WeightSwap), on its own."""

from __future__ import annotations

import torch

from robot_rl.edge.inference import PolicySwap
from robot_rl.edge.swap import WeightSwap


def policy() -> torch.nn.Module:
    return torch.nn.Linear(4, 2)


def test_an_applied_swap_makes_the_dropped_policy_the_next_shadow():
    live = policy()
    swaps = WeightSwap(live, version=0)
    first = swaps.free_shadow()
    assert first is not None and first is not live
    swaps.offer(PolicySwap(version=1, policy=first))
    taken = swaps.take()
    assert taken is not None and taken.policy is first
    assert swaps.free_shadow() is None  # being swapped in: nothing may write into it
    swaps.settle(taken, error=None)
    assert swaps.live is first and swaps.version == 1 and swaps.recycled == 1
    assert swaps.free_shadow() is live  # the dropped policy takes the next weights


def test_newer_weights_withdraw_a_swap_nobody_has_taken():
    live = policy()
    swaps = WeightSwap(live)
    shadow = swaps.free_shadow()
    swaps.offer(PolicySwap(version=1, policy=shadow))
    assert swaps.free_shadow() is shadow and swaps.withdrawn == 1  # v1 withdrawn: the shadow is free again
    assert swaps.take() is None  # the inference side never sees v1
    swaps.offer(PolicySwap(version=2, policy=shadow))
    taken = swaps.take()
    assert taken is not None and taken.version == 2


def test_a_refused_swap_keeps_the_live_policy_and_frees_the_shadow():
    live = policy()
    swaps = WeightSwap(live, version=3)
    shadow = swaps.free_shadow()
    swaps.offer(PolicySwap(version=4, policy=shadow))
    taken = swaps.take()
    assert taken is not None
    swaps.settle(taken, error="swap to v4 failed")
    assert swaps.live is live and swaps.version == 3 and swaps.recycled == 0
    assert swaps.free_shadow() is shadow


def test_the_take_hook_runs_only_when_there_is_a_swap():
    swaps = WeightSwap(policy())
    calls: list[int] = []
    assert swaps.take(on_take=lambda: calls.append(1)) is None and calls == []
    swaps.offer(PolicySwap(version=1, policy=swaps.free_shadow()))
    assert swaps.take(on_take=lambda: calls.append(1)) is not None and calls == [1]
