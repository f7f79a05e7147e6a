"""bench soak: robots stream to a training learner; every step is stored, every process is measured,
and the tiny index budget is kept by reading frames back from the dataset."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest

from robot_rl.bench.soak import run_soak_bench
from robot_rl.bench.transport import SEGMENT_STEPS
from robot_rl.config import load_config
from tests.learner_helpers import tiny_sim_weights

pytestmark = pytest.mark.slow  # processes end to end: started first when the suite runs in parallel

ROBOTS, FPS, DURATION_S = 2, 30, 12.0


def test_a_short_soak_loses_no_step_measures_each_process_and_keeps_the_index_budget(tmp_path, monkeypatch):
    weights, _ = tiny_sim_weights(tmp_path / "weights", monkeypatch)
    cfg = load_config(["+bench=soak", f"bench.robots={ROBOTS}", "bench.image=[48,64]", f"bench.duration_s={DURATION_S}",
                       "bench.episode_s=4", "bench.index_memory_mb=0.05", "bench.warmup_s=4",
                       "bench.sample_every_s=0.5", "bench.small_image=16", "bench.small_duration_s=4",
                       "bench.trainer_alone_s=3",
                       f"learner.init_checkpoint={weights}", "learner.store.commit_linger_s=0",
                       "learner.store.index_read_workers=1", "learner.trainer.min_steps_to_train=8",
                       "learner.trainer.batch_size=4", "learner.trainer.device=cpu"])
    report = run_soak_bench(cfg, progress=lambda message: None)
    assert not report["failures"]
    assert report["lost_steps"] == 0 and report["steps_stored"] == report["steps_streamed"]
    expected = ROBOTS * FPS * DURATION_S  # real time: robots that fell behind catch up, not skip
    assert 0.7 * expected <= report["steps_streamed"] <= expected + ROBOTS * SEGMENT_STEPS
    assert set(report["rss_mb"]) == {"main", "writer", "readers"}
    assert all(mb > 0 for _, mb in report["rss_mb"]["main"]) and report["rss_mb"]["writer"][-1][1] > 0
    # Once all is stored, the index holds no more frames than its budget (52 kB: a few episodes of
    # 16x16 frames); the rest is read back from the spill.
    assert report["index_memory_budget_mb"] == 0.05 and report["writer_drain_s"] is not None
    assert report["index_frame_mb_at_end"] <= report["index_memory_budget_mb"]
    assert report["episodes_in_spill"] >= 1 and report["spill_mb_at_end"] > 0
    for key in ("rss_growth_mb_after_warmup", "writer_backlog_max", "updates_per_s", "updates_per_s_small"):
        assert key in report
    # The trainer alone, reading back what left the index, trains on.
    assert report["updates_per_s_trainer_alone"] > 0
    assert report["cores_used"]["main"] > 0 and report["cores_used"]["writer"] > 0


def test_growth_after_warmup_is_the_trend_of_five_minute_means_not_one_minutes_swing():
    from robot_rl.bench.soak import growth_after

    times = np.arange(0.0, 1800.0, 5.0)
    swing = 40.0 * (-1.0) ** np.arange(len(times))  # the allocator's sample-to-sample swing
    flat = {"main": [[t, 1000.0 + s] for t, s in zip(times, swing, strict=True)], "writer": [[t, 500.0] for t in times]}
    assert abs(growth_after(flat, 300.0)) <= 5.0  # last minus first sample would say +-80 MB
    growing = {"main": [[t, 1000.0 + t / 6 + s] for t, s in zip(times, swing, strict=True)]}  # +10 MB a minute
    assert 195.0 <= growth_after(growing, 300.0) <= 205.0  # 20 minutes between the windows' middles
    # A flat series that sits 60 MB high for its last minute (a batch of big segments decoding): a
    # minute's mean calls that growth, five minutes' a fifth of it.
    late_swing = {"main": [[t, 1000.0 + (60.0 if t >= 1740.0 else 0.0)] for t in times]}
    assert growth_after(late_swing, 300.0, window_s=60.0) >= 55.0
    assert growth_after(late_swing, 300.0) <= 15.0
    # A short run: each window a third of the span after warm-up.
    assert 55.0 <= growth_after({"main": [[t, 1000.0 + t / 6] for t in times[:120]]}, 60.0) <= 65.0
