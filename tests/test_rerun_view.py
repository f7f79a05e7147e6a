"""The Rerun view of an edge node: a short operator session in the sim logs to ``.rrd`` files, and
rerun's own reader finds every camera frame, joint vector, takeover flag and spliced plan, one per
tick or per splice; a viewer that cannot keep up drops its own items and never delays a tick."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from robot_rl.config import load_config
from robot_rl.core.clock import VirtualClock
from robot_rl.core.registry import VIEWERS
from robot_rl.edge import EdgeConfig, EdgeNode
from robot_rl.edge.rerun_view import RerunView
from robot_rl.edge.viewer_config import RerunMode, RerunViewerConfig
from tests.edge_fakes import EncodingPolicy, KinematicRobot
from tests.rerun_helpers import component, read_rrd

JOINTS = 6


@pytest.mark.slow
def test_a_session_logs_cameras_joints_takeovers_and_plans_to_rrd(tmp_path):
    from robot_rl.data import load_episode_arrays
    from robot_rl.session.runner import run_session

    out = tmp_path / "out"
    cfg = load_config([
        "robot=sim_so101", "policy=hold", "policy.chunk_size=10", "teleop=scripted", "teleop.stuck_ticks=15",
        "session.episodes=2", "session.max_episode_steps=40", "session.realtime=false", "session.keys=none",
        "session.ask_outcome=false", "session.seed=3", "robot.image_height=32", "robot.image_width=32",
        "robot.cameras=[front,wrist]", f"output_dir={out}", "viewer=rerun", "viewer.mode=save", "link.robot_id=arm-7",
    ])
    assert run_session(cfg) == 0
    episodes = load_episode_arrays(out / "session", repo_id="local/robot_rl_session")
    ticks = sum(len(e["action"]) for e in episodes)
    rows = read_rrd(out / "rerun" / "arm-7.rrd")  # named after the id the robot streams as

    for camera in ("front", "wrist"):
        assert len(rows[f"arm-7/observation.images.{camera}"]) == ticks
    measured = [component(r, "Scalars:scalars") for r in rows["arm-7/observation.state"]]
    commanded = [component(r, "Scalars:scalars") for r in rows["arm-7/action"]]
    assert len(measured) == len(commanded) == ticks and all(len(v) == JOINTS for v in measured + commanded)
    recorded = np.concatenate([np.asarray(e["action"]) for e in episodes])
    np.testing.assert_allclose(np.asarray(commanded), recorded, atol=1e-4)  # in tick order, every tick
    flags = [component(r, "Scalars:scalars")[0] for r in rows["arm-7/intervention"]]
    recorded_flags = np.concatenate([np.asarray(e["is_intervention"]).reshape(-1) for e in episodes])
    assert flags == [float(f) for f in recorded_flags] and any(flags)  # the scripted operator took over
    assert len(rows["arm-7/policy_version"]) == ticks

    plans = rows["arm-7/plan/next"]
    assert len(plans) >= len(episodes) == 2  # at least the first chunk of each episode
    assert len(rows["arm-7/plan/executing"]) == len(plans)
    for row in plans:
        strips = component(row, "LineStrips2D:strips")
        assert len(strips) == JOINTS and all(len(points) == 10 for points in strips)  # the chunk, joint by joint


def test_a_viewer_that_cannot_keep_up_drops_its_items_and_never_holds_the_control_loop(tmp_path, monkeypatch):
    """The logging thread is stuck; the node still runs its episode to the end (a blocking put would
    hang it), the view counts what it dropped, and what it did queue is written once it is free."""
    release = threading.Event()
    view = VIEWERS.build(RerunViewerConfig(mode=RerunMode.save, dir=str(tmp_path), queue_size=8),
                         robot_id="arm", joint_names=tuple(f"j{i}" for i in range(JOINTS)))
    assert isinstance(view, RerunView)
    original = view._log
    monkeypatch.setattr(view, "_log", lambda item: (release.wait(60), original(item)))
    node = EdgeNode(KinematicRobot(JOINTS), EncodingPolicy(chunk_size=10), VirtualClock(),
                    EdgeConfig(fps=30, mode="async_rollforward"))
    view.attach(node)
    episode = threading.Thread(target=node.run_episode, args=(60,))
    episode.start()
    episode.join(30)
    finished = not episode.is_alive()
    release.set()
    episode.join()
    view.close()
    node.close()
    assert finished, "the control loop waited for the viewer"
    assert node.stats.ticks == 60 and node.stats.sink_errors == 0
    logged = read_rrd(tmp_path / "arm.rrd")
    kept = len(logged["arm/action"]) + len(logged["arm/plan/next"])
    assert 0 < kept <= 8 + 1  # the queue's 8 and the one the stuck thread held
    assert kept + view.dropped == 60 + node.stats.chunks_spliced


def test_a_saved_log_is_named_after_the_robot_id_and_says_where_it_is(tmp_path, caplog):
    caplog.set_level("INFO", logger="robot_rl.edge.rerun_view")
    view = VIEWERS.build(RerunViewerConfig(mode=RerunMode.save, dir=str(tmp_path / "rerun")), robot_id="so101-left",
                         joint_names=tuple(f"j{i}" for i in range(JOINTS)))
    view.close()
    path = tmp_path / "rerun" / "so101-left.rrd"
    assert path.is_file()
    assert any(str(path) in record.getMessage() for record in caplog.records)


def test_viewer_settings_are_checked():
    assert VIEWERS.build(load_config([]).viewer, robot_id="x", joint_names=()) is None  # viewer=none
    cfg = load_config(["viewer=rerun", "viewer.mode=save", "output_dir=/tmp/o"])
    assert cfg.viewer.dir == "/tmp/o/rerun" and cfg.viewer.mode is RerunMode.save
    assert cfg.viewer.for_robots("run-1").recording == "run-1"
    assert cfg.viewer.for_robots("run-1").mode is RerunMode.save
    assert load_config(["viewer=rerun"]).viewer.for_robots("r").mode is RerunMode.connect
    from robot_rl.config import ConfigError

    with pytest.raises(ConfigError, match="viewer.mode"):
        load_config(["viewer=rerun", "viewer.mode=window"])
