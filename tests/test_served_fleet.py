"""The main job's robots served by its learner (``edge.inference_runner=remote``): robot_rl/app/served_fleet.py
and its path through ``run_local`` (robot_rl/app/local_run.py)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from robot_rl.app import main_job
from robot_rl.app.config import LocalRunConfig
from robot_rl.app.evaluation import HeldoutJob
from robot_rl.app.local_run import run_local
from robot_rl.app.served_fleet import check_served_fleet
from robot_rl.config import load_config
from robot_rl.core.errors import ConfigError
from robot_rl.edge.config import EdgeConfig
from robot_rl.learner.serving_config import ServeConfig
from tests.learner_helpers import learner_config, tiny_policy
from tests.test_stream_edge import CameraRobot

REMOTE = "edge.inference_runner=remote"


def test_robots_of_a_served_run_act_on_the_versions_the_learner_serves_and_download_no_weights(tmp_path):
    config = learner_config(tmp_path)
    config.serve_policy = True
    run = LocalRunConfig(num_robots=2, episodes_per_robot=2, max_steps=12, segment_steps=4,
                         spool_dir=str(tmp_path / "spool"), image_format="png",
                         edge=EdgeConfig(fps=30, inference_runner="remote"))
    learners: list = []
    chunk_versions: dict[str, set[int]] = {"sim-0": set(), "sim-1": set()}

    def publish_v1(learner) -> None:
        """A version published as the robots start: the serving copy takes it in place, no robot fetches it."""
        learners.append(learner)
        learner.trainer.version = 1
        learner.trainer.publish_now()

    def on_episode(robot_id: str, episode, version: int) -> None:
        chunk_versions[robot_id] |= {step.policy_version for step in episode.steps if step.chunk_id >= 0}

    result = run_local(config, tiny_policy(), run, lambda i: (CameraRobot(), None, lambda episode: "pick the cube"),
                       train=False, on_start=publish_v1, on_episode=on_episode,
                       serve=ServeConfig(endpoint="tcp://127.0.0.1:*"))
    assert result.episodes == 4 and result.store["episodes_stored"] == 4
    assert result.store["online_steps"] + result.store["held_steps"] == 4 * 12
    # Every robot acted on chunks the learner's server answered it, all of the version it served, and
    # none of the robots downloaded weights (a robot with its own copy starts at v0 and fetches v1).
    assert sorted(result.served_chunks) == ["sim-0", "sim-1"]
    assert all(n >= 2 for n in result.served_chunks.values()), result.served_chunks
    assert chunk_versions == {"sim-0": {1}, "sim-1": {1}}
    assert result.robot_versions == {"sim-0": 1, "sim-1": 1}
    assert learners[0].server.counters["weight_chunks_sent"] == 0


def test_a_run_whose_robots_ask_a_learner_that_does_not_serve_is_refused_before_it_starts(tmp_path):
    run = LocalRunConfig(num_robots=1, episodes_per_robot=1, max_steps=5, spool_dir=str(tmp_path / "spool"),
                         edge=EdgeConfig(fps=30, inference_runner="remote"))
    with pytest.raises(ConfigError, match="learner.serve_policy=true"):
        run_local(learner_config(tmp_path), tiny_policy(), run, lambda i: (CameraRobot(), None, lambda e: "x"))
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize(("overrides", "says"), [
    (["link.policy_server=tcp://gpu.lab:5557"], "not link.policy_server=tcp://gpu.lab:5557"),
    (["serve.endpoint=tcp://0.0.0.0:5557"], "must be a loopback address"),
    (["serve.secret_key=keys/learner.key_secret", "serve.robot_keys_dir=keys/robots"], "unset serve.secret_key"),
    (["serve.endpoint=tcp://127.0.0.1:5555"], "a port of its own"),
    (["edge.mode=async_naive", "edge.real_time_chunking=true"], "carries no frozen prefix"),
    (["edge.max_inflight=3"], "serve.max_queued_per_robot=2"),
])
def test_a_combination_remote_inference_cannot_serve_is_refused_in_one_line(overrides, says):
    with pytest.raises(ConfigError, match=says) as refused:
        check_served_fleet(load_config([REMOTE, *overrides]))
    assert "\n" not in str(refused.value)


def test_the_main_job_refuses_before_anything_starts_and_serves_its_robots_otherwise(tmp_path, monkeypatch):
    def no_start(_cfg):
        raise AssertionError("a BC start was looked for before the refusal")

    monkeypatch.setattr(main_job, "ensure_bc_checkpoint", no_start)
    with pytest.raises(ConfigError, match="link.policy_server"):
        main_job.run_main_job(load_config([f"output_dir={tmp_path}", REMOTE, "link.policy_server=tcp://gpu.lab:5557"]))
    check_served_fleet(load_config([REMOTE, "link.policy_server=tcp://127.0.0.1:5557"]))  # its own server: fine
    check_served_fleet(load_config([REMOTE, *(f'{name}="tcp://127.0.0.1:*"' for name in (  # each a free port
        "serve.endpoint", "learner.service.router_endpoint", "learner.service.pub_endpoint"))]))
    cfg = load_config([f"output_dir={tmp_path}", REMOTE, "learner.store.demonstrations=demos"])
    assert main_job.local_learner_config(cfg, tmp_path / "bc", tmp_path / "run").serve_policy
    local = load_config([f"output_dir={tmp_path}", "learner.store.demonstrations=demos"])
    assert not main_job.local_learner_config(local, tmp_path / "bc", tmp_path / "run").serve_policy


def test_the_held_out_check_of_a_served_run_scores_the_weights_as_a_local_runs_does():
    """Start against final weights on unseen scenes: the same job, policy on this machine, for both arms of
    the paired comparison (the run's remote runner in it would refuse a local policy)."""
    served, local = (HeldoutJob.of(load_config(overrides), 4) for overrides in ([REMOTE], []))
    assert served == local and served.edge.inference_runner != "remote"
