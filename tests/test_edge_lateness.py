"""The edge's lateness accounting on a virtual clock, made exact by a robot whose observation read
takes a chosen time in chosen ticks (a camera that stalls).

At 30 fps a period is 33.3 ms and a tick is late past ``edge.late_threshold_ms`` (5 ms). A read that
takes d in tick n makes tick n+1 start d - 33.3 ms late (never early): 10 ms and 36 ms leave it on time
or under the threshold, 40 ms makes it 6.7 ms late (counted, the schedule kept), 70 ms makes it
36.7 ms late, a whole period, which re-anchors the schedule on that tick instead of firing catch-up
ticks, and says so in a warning at most once a second.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from robot_rl.core.clock import VirtualClock
from robot_rl.edge.config import EdgeConfig
from robot_rl.edge.node import EdgeNode
from tests.edge_fakes import EncodingPolicy, KinematicRobot

FPS = 30
PERIOD_S = 1 / FPS
MS = 1e-3


class StallingRobot(KinematicRobot):
    """The kinematic arm whose observation read advances the virtual clock by ``stalls[tick]`` s."""

    def __init__(self, clock: VirtualClock, stalls: dict[int, float]) -> None:
        super().__init__(num_joints=6, fps=FPS)
        self.clock = clock
        self.stalls = stalls
        self.reads = 0

    def get_observation(self):
        self.clock.advance(self.stalls.get(self.reads, 0.0))
        self.reads += 1
        return super().get_observation()


def run(stalls: dict[int, float], ticks: int) -> tuple[EdgeNode, list]:
    clock = VirtualClock()
    node = EdgeNode(StallingRobot(clock, stalls), EncodingPolicy(), clock, EdgeConfig(fps=FPS))
    episode = node.run_episode(ticks, "go")
    assert len(episode.steps) == ticks
    return node, episode.steps


def test_a_stalled_read_makes_the_next_tick_late_by_the_overrun_and_counts_only_past_the_threshold():
    node, steps = run({10: 10 * MS, 20: 36 * MS, 30: 40 * MS}, 40)
    lateness = np.array([s.lateness_s for s in steps])
    expected = np.zeros(40)
    expected[21], expected[31] = 36 * MS - PERIOD_S, 40 * MS - PERIOD_S  # 2.7 ms and 6.7 ms
    assert np.allclose(lateness, expected, rtol=0, atol=1e-9)
    assert node.stats.late_ticks == 1  # only the 6.7 ms one is past 5 ms
    assert node.stats.max_lateness_s == pytest.approx(40 * MS - PERIOD_S, abs=1e-9)
    # Under a period the schedule is kept: the tick after a late one starts on its old time.
    times = np.array([s.time_s for s in steps])
    assert np.allclose(times - times[0], np.arange(40) * PERIOD_S + expected, rtol=0, atol=1e-9)


def test_a_tick_a_whole_period_late_re_anchors_the_schedule_without_a_catch_up_burst(caplog):
    """After the 70 ms read of tick 30, tick 31 starts 36.7 ms late and every later tick one period
    after the one before: no tick fires at once to catch up, and in any window of virtual time there
    are exactly as many ticks as periods. Without re-anchoring tick 32 would start 3.3 ms after 31."""
    with caplog.at_level(logging.WARNING, logger="robot_rl.edge.node"):
        node, steps = run({30: 70 * MS}, 60)
    overrun = 70 * MS - PERIOD_S
    times = np.array([s.time_s for s in steps])
    gaps = np.diff(times)
    expected_gaps = np.full(59, PERIOD_S)
    expected_gaps[30] = 70 * MS  # tick 30 -> 31: the read's time
    assert np.allclose(gaps, expected_gaps, rtol=0, atol=1e-9)
    assert np.allclose(times[31:] - times[0], np.arange(31, 60) * PERIOD_S + overrun, rtol=0, atol=1e-9)
    assert [s.tick for s in steps if s.lateness_s > 0] == [31]  # the ticks after it are on the new schedule
    window = (times >= times[31]) & (times < times[31] + 0.5)
    assert int(window.sum()) == 15  # half a second holds 15 ticks, not more
    assert node.stats.late_ticks == 1
    assert node.stats.max_lateness_s == pytest.approx(overrun, abs=1e-9)
    warnings = [r.getMessage() for r in caplog.records if "re-anchoring" in r.getMessage()]
    assert warnings == ["tick 31 started 36.7 ms late (1 such ticks in the last second); re-anchoring the schedule"]


def test_the_late_tick_warning_is_said_at_most_once_a_second_and_counts_the_ones_it_held_back(caplog):
    """Three whole-period stalls within a second warn once; the next one, over a second later, warns
    again and counts the two it held back with itself."""
    stalls = {10: 70 * MS, 15: 80 * MS, 20: 90 * MS, 60: 100 * MS}
    with caplog.at_level(logging.WARNING, logger="robot_rl.edge.node"):
        node, steps = run(stalls, 70)
    assert [s.tick for s in steps if s.lateness_s > 0] == [11, 16, 21, 61]
    assert node.stats.late_ticks == 4
    assert node.stats.max_lateness_s == pytest.approx(100 * MS - PERIOD_S, abs=1e-9)
    warnings = [r.getMessage() for r in caplog.records if "re-anchoring" in r.getMessage()]
    assert len(warnings) == 2
    assert warnings[0].startswith("tick 11 started 36.7 ms late (1 such ticks")
    assert warnings[1].startswith("tick 61 started 66.7 ms late (3 such ticks")
