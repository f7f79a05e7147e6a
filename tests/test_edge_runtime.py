"""The one edge runtime (robot_rl.edge.runtime.EdgeRuntime): every robot runs through it, and a
robot killed mid-episode has streamed that episode to the learner and keeps it in its own dataset,
but for at most one segment."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest

from robot_rl.app import local_run, sim_edge
from robot_rl.bridges.zmq.client import ClientConfig
from robot_rl.bridges.zmq.segments import ImageEncoding
from robot_rl.core.clock import WallClock
from robot_rl.core.layout import RecordedLayout
from robot_rl.data.reader import load_episode_arrays
from robot_rl.data.recorder import EpisodeRecorder
from robot_rl.edge.config import EdgeConfig
from robot_rl.edge.runtime import EdgeRuntime
from robot_rl.learner.service import LearnerService
from tests.learner_helpers import IMG, client_config, learner_config, store_config, tiny_policy, wait_for
from tests.test_stream_edge import CameraRobot

REPO = Path(__file__).resolve().parent.parent
SEGMENT = 10  # steps per streamed (and journalled) segment in the kill test
FINISHED_TICKS = 5  # the recording edge's first episode, ended and written before the one it is killed in


class RecordedCameraRobot(CameraRobot):
    """The camera test arm, declaring its camera's size as a real robot does (its local dataset's layout)."""

    camera_shapes = {"front": (IMG, IMG)}


def test_the_main_jobs_robots_session_and_edge_all_run_the_one_edge_runtime(tmp_path, monkeypatch):
    from robot_rl.commands import edge, session
    from tests.learner_helpers import tiny_sim_weights

    built: list[str] = []
    real_init = EdgeRuntime.__init__

    def recording_init(self, *args, **kwargs):
        built.append(kwargs["robot_id"])
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(EdgeRuntime, "__init__", recording_init)
    monkeypatch.setattr(sim_edge, "LINK_CONNECT_S", 0.1)
    monkeypatch.setattr(sim_edge, "FINAL_ACK_S", 0.1)
    # The main job's robot, as its robot process runs it (robot_process._child_main -> run_robot -> run_edge).
    nowhere = SimpleNamespace(router_endpoint="tcp://127.0.0.1:9", pub_endpoint=None)
    run = local_run.LocalRunConfig(num_robots=1, episodes_per_robot=1, max_steps=3, spool_dir=str(tmp_path / "spool"),
                                   edge=EdgeConfig(fps=30), record_dir=str(tmp_path / "robots"))
    sim_edge.run_robot(0, client_config("sim-0", nowhere, tmp_path / "spool"), tiny_policy(), run,
                        lambda i: (RecordedCameraRobot(), None, lambda e: "pick the cube"), {}, lambda: False)
    assert (tmp_path / "robots" / "sim-0" / "meta" / "info.json").exists()  # recorded locally, as a real robot
    common = ["robot=sim_so101", "teleop=none", "session.episodes=1", "session.max_episode_steps=3",
              "session.realtime=false", "session.keys=none", "robot.image_height=32", "robot.image_width=32",
              "link.robot_id=ROBOT"]
    assert session.main([*[c.replace("ROBOT", "operator") for c in common], "policy=hold",
                         f"output_dir={tmp_path / 'session'}"]) == 0
    weights, _ = tiny_sim_weights(tmp_path / "policy", monkeypatch)
    assert edge.main([*[c.replace("ROBOT", "unattended") for c in common], f"policy.path={weights}",
                      "link.learner=tcp://127.0.0.1:9", "session.final_ack_timeout_s=0",
                      f"output_dir={tmp_path / 'edge'}"]) == 0
    assert built == ["sim-0", "sim_so101", "unattended"]  # a session without link.learner names the robot itself


def test_a_learner_that_refuses_the_robot_stops_the_runtime_with_one_line(tmp_path):
    learner = LearnerService(learner_config(tmp_path / "learner"), tiny_policy(), train=False).start()
    runtime = EdgeRuntime(RecordedCameraRobot(), tiny_policy(), WallClock(), EdgeConfig(fps=30), robot_id="edge-r",
                          client=client_config("edge-r", learner, tmp_path / "spool", config_hash="another model"))
    try:
        with pytest.raises(ConnectionError, match=f"learner at {learner.router_endpoint} refused this robot"):
            runtime.start(20.0)
        assert runtime.link is None  # nothing left running; closing costs no ack wait
    finally:
        runtime.close(ack_timeout_s=0.0)
        learner.stop(checkpoint=False)


def recording_runtime(dataset: Path, client: ClientConfig | None = None) -> EdgeRuntime:
    """A robot recording into its own dataset at ``dataset``, streaming to a learner if ``client`` says which."""
    robot = RecordedCameraRobot()
    layout = RecordedLayout.of_robot(robot)
    recorder = EpisodeRecorder(dataset, layout.fps, layout.joint_names, layout.camera_shapes)
    return EdgeRuntime(robot, tiny_policy(), WallClock(), EdgeConfig(fps=30), robot_id="edge-k", client=client,
                       recorder=recorder, segment_steps=SEGMENT, image_encoding=ImageEncoding("png"))


def killed_edge_child(endpoints: str, spool: str, dataset: str, progress: str) -> None:
    """An edge streaming to the learner at ``endpoints`` and recording into its own dataset: one short
    episode to its end, then an endless one on the wall clock, writing each finished tick's count to
    ``progress`` (the test kills it with SIGKILL)."""
    router, pub = json.loads(endpoints)
    learner = SimpleNamespace(router_endpoint=router, pub_endpoint=pub)
    runtime = recording_runtime(Path(dataset), client_config("edge-k", learner, Path(spool)))
    runtime.robot.connect()
    runtime.start(30.0)
    runtime.run_episode(FINISHED_TICKS, "pick the cube")
    runtime.begin_episode("place the cube")
    with open(progress, "w") as out:
        while True:
            step = runtime.tick()
            out.write(f"{step.tick + 1}\n")
            out.flush()


def test_an_edge_killed_mid_episode_has_streamed_it_and_keeps_it_in_its_local_dataset_but_for_one_segment(tmp_path):
    """One kill, both sides checked: the learner stores the cut episode once it is silent past the
    episode timeout, and the restarted edge stores it into its own dataset from its journal; each
    holds all of it but at most one segment, from tick 0, as truncated."""
    config = learner_config(tmp_path / "learner")
    config.store = store_config(tmp_path / "learner" / "store", background_commit=True, episode_timeout_s=1.0)
    learner = LearnerService(config, tiny_policy(), train=False).start()
    dataset, progress = tmp_path / "robots" / "edge-k", tmp_path / "ticks"
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    code = "import sys; from tests.test_edge_runtime import killed_edge_child; killed_edge_child(*sys.argv[1:])"
    child = subprocess.Popen([sys.executable, "-c", code, json.dumps([learner.router_endpoint, learner.pub_endpoint]),
                              str(tmp_path / "spool"), str(dataset), str(progress)], cwd=REPO, env=env)
    try:
        wait_for(lambda: progress.exists() and len(progress.read_text().split()) >= 75, timeout_s=120,
                 what="the edge ticking mid-episode")
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        recorded = int(progress.read_text().split()[-1])  # the edge ran at least this many ticks
        wait_for(lambda: learner.store.stats()["episodes_stored"] == 2, timeout_s=60,
                 what="the finished episode and the cut one stored (silent past the episode timeout)")
        assert learner.store.flush(60)
    finally:
        if child.poll() is None:
            child.kill()
        learner.stop(checkpoint=False)
    streamed_finished, streamed = load_episode_arrays(tmp_path / "learner" / "store" / "dataset",
                                                      "local/robot_rl_replay")
    assert len(streamed_finished["action"]) == FINISHED_TICKS
    ticks = len(streamed["action"])
    assert recorded - SEGMENT <= ticks <= recorded + 1  # at most one segment lost (a tick may follow the count)
    assert not np.asarray(streamed["next.done"]).reshape(-1)[-1]  # stored as truncated: no outcome claimed

    restarted = recording_runtime(dataset)  # the restart: the runtime stores what the crash cut short
    restarted.close()
    finished, cut = load_episode_arrays(dataset, "local/robot_rl")
    assert len(finished["action"]) == FINISHED_TICKS and np.asarray(finished["next.done"]).reshape(-1)[-1]
    ticks = len(cut["action"])
    assert recorded - SEGMENT <= ticks <= recorded + 1  # at most one segment lost (a tick may follow the count)
    assert restarted.recovered_ticks == ticks
    assert not np.asarray(cut["next.done"]).reshape(-1).any()  # truncated: no outcome claimed
    assert np.asarray(cut["frame_index"]).tolist() == list(range(ticks))  # from its tick 0, no tick missing
    assert cut["instruction"] == "place the cube"

    again = recording_runtime(dataset)  # the journal was emptied: a second start stores nothing twice
    again.close()
    assert again.recovered_ticks == 0 and len(load_episode_arrays(dataset, "local/robot_rl")) == 2
