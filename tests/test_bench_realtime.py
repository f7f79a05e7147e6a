"""`robot-rl bench realtime`, shortened: an edge process whose policy runs in its own process
streams to a learner that trains and publishes, swaps the new weights in while it ticks, and
the soak reports every tick of its measured window. What is checked is that the parts work
together and that the counts follow from the window (duration, rate, robots); the lateness
figures are the benchmark's (BENCHMARKS.md)."""

from __future__ import annotations

import pytest

from robot_rl.bench.config import RealtimeBenchConfig
from robot_rl.bench.realtime import FPS, fifo_label, soak
from robot_rl.core.priority import realtime_thread
from robot_rl.edge.config import EdgeConfig

pytestmark = pytest.mark.slow


def test_a_short_soak_counts_the_ticks_and_swaps_of_its_window_and_the_scheduling_that_ran(tmp_path):
    cfg = RealtimeBenchConfig(duration_s=6.0, robots=1, swap_every_s=1.0, runners=["process"])
    report = soak("process", cfg, tmp_path / "soak", progress=lambda _msg: None)
    # 6 s at 30 fps: at most 180 ticks (and one either side of the window's ends): a catch-up burst, or
    # ticks counted past the window (the edge ends its episode after the stop), would make more; ticks
    # a whole period late re-anchor the schedule, so a loaded machine makes fewer.
    window_ticks = cfg.duration_s * FPS * cfg.robots
    assert window_ticks / 2 <= report["ticks"] <= window_ticks + 2 * cfg.robots
    # A version published every second: the edge swapped in some of those the window saw (and at most
    # one published before it), not the swaps of its whole life.
    assert report["learner_updates"] > 0 and report["versions_published"] >= 1
    assert 1 <= report["swaps"] <= report["versions_published"] + cfg.robots
    # SCHED_FIFO ran for every measured tick where this machine grants it to a thread, else for none.
    with realtime_thread(EdgeConfig().realtime_priority) as granted:
        pass
    assert report["ticks_under_fifo"] == (report["ticks"] if granted else 0)
    assert (tmp_path / "soak" / "learner.log").read_text().count("published weights") >= 1  # it logged beside them


def test_the_table_says_for_how_many_ticks_sched_fifo_was_granted():
    assert [fifo_label(180, 180), fifo_label(0, 180), fifo_label(90, 180)] == ["all", "none", "90 of 180"]

