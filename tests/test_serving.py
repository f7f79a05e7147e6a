"""The policy server (robot_rl/learner/serving.py) and the edge's remote runner (robot_rl/edge/remote_runner.py)."""

from __future__ import annotations

import logging
import multiprocessing as mp
import threading
import time

import numpy as np
import pytest
import torch

from robot_rl.bridges.zmq.codec import ProtocolError, decode_frames
from robot_rl.bridges.zmq.inference_wire import FrameSize, PolicyInfo, decode_info, encode_info
from robot_rl.bridges.zmq.keys import ClientCurve, generate_keypair
from robot_rl.bridges.zmq.link import LinkConfig
from robot_rl.bridges.zmq.segments import ImageEncoding, decode_image, encode_image
from robot_rl.core.clock import WallClock
from robot_rl.edge.config import EdgeConfig
from robot_rl.edge.inference import InferenceRequest, make_worker
from robot_rl.edge.remote_runner import RemoteInferenceConfig, RemotePolicy, RemoteRunner
from robot_rl.learner.serving import PolicyServer, ServeConfig, robot_noise_seed
from robot_rl.policies.trainable import InputFrames
from tests.learner_helpers import IMG, tiny_policy, wait_for

STATE = np.linspace(-0.5, 0.5, 6).astype(np.float32)
INSTRUCTION = "push the cube"


def frame(seed: int, size: int = IMG) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)


def request(chunk_id: int, image: np.ndarray, state: np.ndarray = STATE, tick: int = 0) -> InferenceRequest:
    return InferenceRequest(chunk_id=chunk_id, request_tick=tick, request_time_s=time.monotonic(),
                            images={"front": image}, state=state, instruction=INSTRUCTION, executed_index=-1,
                            delay_ticks=0, delay_estimate=0, start_tick=None, rolled_state=None, generation=0)


def as_received(image: np.ndarray) -> np.ndarray:
    """What the server decodes from the edge's JPEG of ``image`` (already at the policy's input size)."""
    return decode_image(encode_image(image, ImageEncoding(jpeg_quality=90)), "jpeg", image.shape)


def remote(server: PolicyServer, robot_id: str, **kwargs) -> RemotePolicy:
    return RemotePolicy(RemoteInferenceConfig(server.endpoint, robot_id, connect_timeout_s=10.0, **kwargs))


def runner_of(policy: RemotePolicy) -> RemoteRunner:
    return policy.runner(time.monotonic, policy.action_dim, max_inflight=2)


def settle(runner: RemoteRunner, timeout_s: float = 20.0):
    """The request in flight's result, or None once the runner gave it up."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = runner.poll(time.monotonic())
        if result is not None or runner.in_flight == 0:
            return result
        time.sleep(0.005)
    raise AssertionError("the remote runner neither answered nor gave up")


def wait_result(runner: RemoteRunner, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = runner.poll(time.monotonic())
        if result is not None:
            return result
        time.sleep(0.005)
    raise AssertionError("no result from the remote runner")


@pytest.fixture
def served():
    servers: list[PolicyServer] = []

    def start(policy=None, **config) -> PolicyServer:
        server = PolicyServer(policy if policy is not None else tiny_policy(),
                              ServeConfig(endpoint=config.pop("endpoint", "tcp://127.0.0.1:*"), **config)).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def local_chunk(image: np.ndarray, robot_id: str, noise_seed: int = 0, policy=None) -> np.ndarray:
    """The chunk the robot's own policy computes for the same request and the same noise stream."""
    policy = policy if policy is not None else tiny_policy()
    policy.reseed_noise(robot_noise_seed(noise_seed, robot_id))
    return policy.predict_chunk({"front": as_received(image)}, STATE, INSTRUCTION)


def test_a_served_edge_gets_the_chunk_its_local_policy_computes_for_the_same_request_and_noise(served):
    server = served()
    policy = remote(server, "arm-a")
    try:
        runner = runner_of(policy)
        runner.submit(request(1, frame(1)))
        result = wait_result(runner)
        assert result.error is None
        np.testing.assert_allclose(result.chunk.actions, local_chunk(frame(1), "arm-a"), atol=1e-5)
        assert result.policy_version == 0 and result.chunk.chunk_id == 1
    finally:
        policy.close()


class FrameShapePolicy:
    """Reads one camera at 96x96 with pi0's resize (bars centred); each chunk reports the frame it was given:
    its height and width, a corner's pixel and the centre's."""

    chunk_size, action_dim = 4, 6
    cameras = ("front",)
    input_frames = {"front": InputFrames(96, 96, "pad_center")}

    def predict_chunk(self, observation: dict, state: np.ndarray, instruction: str) -> np.ndarray:
        image = observation["front"]
        return np.tile(np.array([*image.shape[:2], image[0, 0, 0], image[48, 48, 0], 0, 0], np.float32), (4, 1))


def test_a_served_edge_sends_each_camera_fitted_as_the_policy_fits_it(served):
    """A policy that pads its frames (SmolVLA, pi0) must see its bars: a square stretch of a 640x480 scene is
    not what it was trained on. The edge fits with the policy's own resize, at the size it declares."""
    policy = remote(served(FrameShapePolicy()), "arm-a")
    try:
        assert policy.info.frames == {"front": FrameSize(96, 96, "pad_center")}
        runner = runner_of(policy)
        runner.submit(request(1, np.full((480, 640, 3), 200, np.uint8)))
        height, width, corner, centre = wait_result(runner).chunk.actions[0, :4]
        assert (height, width) == (96, 96)  # 640x480 -> 96x72, bars of 12 rows above and below
        assert corner <= 3 and abs(centre - 200) <= 3  # the bar is black, the scene as it was (JPEG's rounding)
    finally:
        policy.close()


def test_two_robots_batched_get_the_chunks_each_would_get_alone(served):
    server = served(batch_window_ms=500.0)  # long enough that both requests share one forward
    a, b = remote(server, "arm-a"), remote(server, "arm-b")
    try:
        runner_a, runner_b = runner_of(a), runner_of(b)
        runner_a.submit(request(1, frame(1)))
        runner_b.submit(request(1, frame(2)))
        got_a, got_b = wait_result(runner_a), wait_result(runner_b)
        assert server.stats.batch_sizes == [2]  # one forward for both
        np.testing.assert_allclose(got_a.chunk.actions, local_chunk(frame(1), "arm-a"), atol=1e-5)
        np.testing.assert_allclose(got_b.chunk.actions, local_chunk(frame(2), "arm-b"), atol=1e-5)
        assert not np.allclose(got_a.chunk.actions, got_b.chunk.actions)
    finally:
        a.close()
        b.close()


def test_load_published_serves_new_weights_from_the_next_forward_and_a_pinned_robot_its_version(served):
    old, new = tiny_policy(seed=0), tiny_policy(seed=1)
    server = served(policy=tiny_policy(seed=0), resident_versions=1)
    server.load_published(new.published_state_dict(), version=1)
    assert server.resident_versions == [1, 0]
    newest, pinned = remote(server, "arm-a"), remote(server, "arm-b", pinned_version=0)
    try:
        runner_new, runner_pinned = runner_of(newest), runner_of(pinned)
        runner_new.submit(request(1, frame(1)))
        runner_pinned.submit(request(1, frame(1)))
        got_new, got_pinned = wait_result(runner_new), wait_result(runner_pinned)
        assert (got_new.policy_version, got_pinned.policy_version) == (1, 0)
        np.testing.assert_allclose(got_new.chunk.actions, local_chunk(frame(1), "arm-a", policy=new), atol=1e-5)
        np.testing.assert_allclose(got_pinned.chunk.actions, local_chunk(frame(1), "arm-b", policy=old), atol=1e-5)
    finally:
        newest.close()
        pinned.close()


def test_a_version_no_longer_resident_is_refused_with_the_reason(served):
    server = served(resident_versions=0)
    server.load_published(tiny_policy(seed=1).published_state_dict(), version=1)
    policy = remote(server, "arm-a", pinned_version=0)
    try:
        runner = runner_of(policy)
        runner.submit(request(1, frame(1)))
        result = wait_result(runner)
        assert result.chunk is None and "v0 is not resident" in result.error
    finally:
        policy.close()


def test_load_published_refuses_weights_that_do_not_fit_and_keeps_serving_its_own(served):
    server = served()
    before = {k: v.clone() for k, v in server.policy.published_state_dict().items()}
    wrong = {k: torch.zeros(3) for k in before}
    with pytest.raises(RuntimeError, match="shape"):
        server.load_published(wrong, version=5)
    assert server.version == 0
    assert all(torch.equal(before[k], v) for k, v in server.policy.published_state_dict().items())


def test_a_request_past_its_deadline_is_dropped_not_answered_late(served):
    server = served(batch_window_ms=300.0)
    quiet = remote(server, "arm-b")  # known but not asking: the window stays open longer than the budget
    policy = remote(server, "arm-a", deadline_s=0.05)
    try:
        runner = runner_of(policy)
        runner.submit(request(1, frame(1)))
        wait_for(lambda: server.stats.dropped_late == 1, what="the server to drop the late request")
        assert settle(runner) is None
        assert server.stats.chunks == 0 and runner.given_up == 1
    finally:
        policy.close()
        quiet.close()


def test_an_unknown_curve_key_is_refused(served, tmp_path):
    server_pub, server_secret = generate_keypair(tmp_path / "server", "server")
    generate_keypair(tmp_path / "robots", "arm-a")
    _, stranger_secret = generate_keypair(tmp_path / "strangers", "arm-a")
    server = served(secret_key=str(server_secret), robot_keys_dir=str(tmp_path / "robots"))
    curve = ClientCurve.from_files(stranger_secret, server_pub)
    with pytest.raises(ConnectionError, match="did not answer"):
        RemotePolicy(RemoteInferenceConfig(server.endpoint, "arm-a", curve=curve, connect_timeout_s=1.5))
    assert server.stats.chunks == 0


def test_a_robot_key_cannot_ask_as_another_robot(served, tmp_path):
    server_pub, server_secret = generate_keypair(tmp_path / "server", "server")
    _, arm_a_secret = generate_keypair(tmp_path / "robots", "arm-a")
    server = served(secret_key=str(server_secret), robot_keys_dir=str(tmp_path / "robots"))
    curve = ClientCurve.from_files(arm_a_secret, server_pub)
    with pytest.raises(ConnectionError, match="cannot speak for robot 'arm-b'"):
        RemotePolicy(RemoteInferenceConfig(server.endpoint, "arm-b", curve=curve, connect_timeout_s=5.0))
    policy = RemotePolicy(RemoteInferenceConfig(server.endpoint, "arm-a", curve=curve, connect_timeout_s=5.0))
    try:
        assert policy.predict_chunk({"front": frame(1)}, STATE, INSTRUCTION).shape == (4, 6)
    finally:
        policy.close()


def test_server_gone_the_edge_gives_up_says_so_once_and_resumes_when_it_is_back(served, caplog):
    server = served(endpoint="tcp://127.0.0.1:*")
    endpoint = server.endpoint
    policy = remote(server, "arm-a", deadline_s=0.2)
    try:
        runner = runner_of(policy)
        runner.submit(request(1, frame(1)))
        assert wait_result(runner).chunk is not None
        server.close()
        caplog.set_level(logging.WARNING, logger="robot_rl.edge.remote_runner")
        for chunk_id in range(2, 5):  # three requests in a row find no server
            runner.submit(request(chunk_id, frame(1)))
            assert settle(runner) is None
        assert runner.given_up == 3
        silent = [r for r in caplog.records if "gave no chunk" in r.getMessage()]
        assert len(silent) == 1
        served(endpoint=endpoint)
        for chunk_id in range(5, 100):  # until the reconnect completes
            runner.submit(request(chunk_id, frame(1)))
            if (result := settle(runner)) is not None:
                break
        assert result is not None and result.chunk is not None
        assert len([r for r in caplog.records if "chunks resume" in r.getMessage()]) == 1
    finally:
        policy.close()


def test_the_edge_node_takes_the_remote_runner_for_a_served_policy(served):
    server = served()
    policy = remote(server, "arm-a")
    try:
        worker = make_worker(policy, 0, policy.action_dim, WallClock(), EdgeConfig(inference_runner="remote"))
        assert isinstance(worker, RemoteRunner)
        with pytest.raises(ValueError, match="remote"):
            make_worker(tiny_policy(), 0, 6, WallClock(), EdgeConfig(inference_runner="remote"))
    finally:
        policy.close()


def test_link_settings_name_the_policy_server_and_its_key_defaults_to_the_learners(tmp_path):
    with pytest.raises(ValueError, match="link.policy_server"):
        RemoteInferenceConfig.from_link(LinkConfig(), "arm-a")
    learner_pub, _ = generate_keypair(tmp_path, "learner")
    _, robot_secret = generate_keypair(tmp_path / "robots", "arm-a")
    link = LinkConfig(policy_server="tcp://gpu.lab:5557", secret_key=str(robot_secret), learner_key=str(learner_pub))
    config = RemoteInferenceConfig.from_link(link, "arm-a")
    assert config.endpoint == "tcp://gpu.lab:5557" and config.robot_id == "arm-a"
    assert config.curve is not None and config.curve.server_public == ClientCurve.from_files(
        robot_secret, learner_pub).server_public


def test_a_learner_that_serves_takes_each_published_version_in_place(tmp_path):
    from robot_rl.learner.service import LearnerService
    from robot_rl.learner.serving import serve_from_learner
    from tests.learner_helpers import learner_config

    service = LearnerService(learner_config(tmp_path), tiny_policy(), train=False)
    server = serve_from_learner(service, ServeConfig(endpoint="tcp://127.0.0.1:*"))
    service.start()
    policy = remote(server, "arm-a")
    try:
        runner = runner_of(policy)
        runner.submit(request(1, frame(1)))
        assert wait_result(runner).policy_version == 0
        trained = service.trainer.deployed
        with torch.no_grad():  # what an update does to the trainer's weights
            for parameter in trained.parameters():
                parameter.add_(0.05)
        service.trainer.version = 1
        service.trainer.publish_now()
        assert server.version == 1 and server.policy is not trained  # a copy, not the training weights
        runner.submit(request(2, frame(1)))
        served = wait_result(runner)
        assert served.policy_version == 1
        trained.reseed_noise(robot_noise_seed(0, "arm-a"))
        trained.predict_chunk({"front": as_received(frame(1))}, STATE, INSTRUCTION)  # the robot's first draw
        expected = trained.predict_chunk({"front": as_received(frame(1))}, STATE, INSTRUCTION)
        np.testing.assert_allclose(served.chunk.actions, expected, atol=1e-5)
    finally:
        policy.close()
        server.close()
        service.stop(checkpoint=False)


def _serve_tiny(endpoint: str, conn) -> None:
    """A policy server in a process of its own (the GPU box's): built at once, bound when told, until killed."""
    policy = tiny_policy()
    conn.recv()
    server = PolicyServer(policy, ServeConfig(endpoint=endpoint)).start()
    conn.send(server.endpoint)
    while True:
        time.sleep(1.0)


class _ServerProcess:
    """Spawned ahead (a fresh interpreter takes seconds to import torch); ``bind`` starts serving."""

    def __init__(self, endpoint: str) -> None:
        self.conn, child = mp.get_context("spawn").Pipe()
        self.process = mp.get_context("spawn").Process(target=_serve_tiny, args=(endpoint, child), daemon=True)
        self.process.start()

    def bind(self) -> str:
        self.conn.send("bind")
        assert self.conn.poll(120), "the policy server process did not start"
        return self.conn.recv()


@pytest.mark.slow(order=1)
def test_an_edge_runtime_served_remotely_holds_while_the_server_is_killed_and_resumes(caplog):
    from robot_rl.edge.runtime import EdgeRuntime
    from tests.edge_fakes import KinematicRobot

    first = _ServerProcess("tcp://127.0.0.1:*")
    endpoint = first.bind()
    second = _ServerProcess(endpoint)  # the same server, restarted
    policy = RemotePolicy(RemoteInferenceConfig(endpoint, "arm-a", deadline_s=3.0))  # a loaded CI box is slow
    runtime = EdgeRuntime(KinematicRobot(), policy, WallClock(), EdgeConfig(fps=30, inference_runner="remote"),
                          robot_id="arm-a")
    policy.predict_chunk({"front": frame(1)}, STATE, INSTRUCTION)  # the warm-up a session runs before tick 0
    caplog.set_level(logging.WARNING, logger="robot_rl.edge.remote_runner")
    episode: list = []
    worker = threading.Thread(target=lambda: episode.append(runtime.run_episode(300, INSTRUCTION)))
    try:
        worker.start()
        wait_for(lambda: runtime.node.stats.chunks_spliced >= 2, what="chunks from the server")
        first.process.kill()
        wait_for(lambda: any("gave no chunk" in r.getMessage() for r in caplog.records), what="the edge to notice")
        spliced_while_away = runtime.node.stats.chunks_spliced
        time.sleep(1.0)  # the plan runs out: the arm holds
        second.bind()
        worker.join(timeout=60.0)
        steps = episode[0].steps
        assert len(steps) == 300  # every tick recorded, held ones too
        assert runtime.node.stats.stall_ticks > 0 and runtime.node.stats.chunks_spliced > spliced_while_away
        assert len([r for r in caplog.records if "gave no chunk" in r.getMessage()]) == 1
        assert len([r for r in caplog.records if "chunks resume" in r.getMessage()]) == 1
    finally:
        worker.join(timeout=60.0)
        runtime.close()
        policy.close()
        first.process.kill()
        second.process.kill()


@pytest.mark.parametrize("frames", [{"front": [0, 96, "stretch"]}, {"front": [96, 96]}, {"front": [96, 5000, "pad"]},
                                    {"front": "96x96"}, {7: [96, 96, "stretch"]}])
def test_a_policy_info_whose_frames_are_malformed_is_refused_naming_the_camera(frames):
    info = PolicyInfo(action_dim=6, state_dim=6, chunk_size=4, cameras=("front",),
                      frames={"front": FrameSize(96, 128, "pad_top_left")}, config_hash="h", version=3)
    assert decode_info(decode_frames(encode_info(info))) == info  # round trip
    raw = decode_frames(encode_info(info))
    raw.body["frames"] = frames
    with pytest.raises(ProtocolError, match=r"policy_info: frames\[.*\] must be \[height, width, fit\]"):
        decode_info(raw)
