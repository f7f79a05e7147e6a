"""bench cameras: both image layouts fed in real time, every written episode read back, the sizes compared."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from robot_rl.bench.cameras import run_cameras_bench
from robot_rl.bench.config import CamerasBenchConfig
from robot_rl.config import ConfigError, load_config

pytestmark = pytest.mark.slow  # processes end to end: started first when the suite runs in parallel


def test_each_layout_is_fed_in_real_time_and_read_back():
    cfg = CamerasBenchConfig(robots=1, image=[32, 48], window_s=4, episode_s=2, drain_timeout_s=120, small_image=16)
    report = run_cameras_bench(cfg, progress=lambda msg: None)
    rows = {row["layout"]: row for row in report["sustained"]}
    assert list(rows) == ["video", "png"]
    for row in rows.values():
        # One robot, a 2 s episode due every 2 s from t = 2 s: episodes at 2 and 4 s.
        assert row["episodes_finished"] == 2
        assert row["frames_per_s_needed"] == 60.0  # 2 cameras at 30 Hz
        assert row["backlog"] and all(n >= 0 for _, n in row["backlog"])
        if row["episodes_written"]:
            assert row["read"]["frames"] == 2 * 60 * min(4, row["episodes_written"])
    for row in report["read"]:
        assert row["image"] == [16, 16] and row["frames"] == 4 * 2 * 60
    small = {row["layout"]: row for row in report["read"]}
    assert small["video"]["kb_per_frame"] < small["png"]["kb_per_frame"]


def test_settings_are_checked():
    assert load_config(["+bench=cameras", "bench.layouts=[video]"]).bench.layouts == ["video"]
    with pytest.raises(ConfigError, match="png and/or video"):
        load_config(["+bench=cameras", "bench.layouts=[jpeg]"])
    with pytest.raises(ValueError, match="even"):
        CamerasBenchConfig(image=[481, 640])
