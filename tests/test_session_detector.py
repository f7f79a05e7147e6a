"""The success detector at the robot: the learner's acks carry its guess on the running episode, a
session ends an episode on a sure success and asks its operator only when the detector is unsure
(showing its guess), and the operator's answer is stored as theirs and teaches the detector.

Real parts on loopback: a learner (``LearnerService``, its store judging on its own threads), the
edge runtime and the operator session. Stand-ins for absent hardware only: an arm whose camera shows
a synthetic "place" scene, and an operator at the keyboard who answers [f] when asked."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from robot_rl.app.unattended_verdicts import UnattendedVerdicts, run_judged_episode
from robot_rl.bridges.zmq.protocol import Ack, ProtocolError, decode_message, encode_message, guess_of
from robot_rl.bridges.zmq.segments import ImageEncoding
from robot_rl.core.clock import VirtualClock
from robot_rl.core.types import SUCCESS_SOURCES, Episode, VerdictSource
from robot_rl.data.reader import load_episode_arrays
from robot_rl.edge.config import EdgeConfig
from robot_rl.edge.runtime import EdgeRuntime
from robot_rl.hardware.teleop import TakeoverBlender, TeleopIntervention
from robot_rl.hardware.teleop.base import NoTeleopConfig, null_teleop
from robot_rl.hardware.teleop.keys import NoKeys
from robot_rl.learner.detector_config import DetectorConfig
from robot_rl.learner.detector_episodes import LabelledEpisode
from robot_rl.learner.ledger import CommitRecord
from robot_rl.learner.service import LearnerService
from robot_rl.session.config import SessionConfig
from robot_rl.session.loop import OperatorSession, SessionResult
from robot_rl.session.status import StatusLine
from tests.detector_helpers import SIZE, episodes, one_torch_thread  # noqa: F401 (a fixture)
from tests.edge_fakes import EncodingPolicy, KinematicRobot
from tests.learner_helpers import JOINTS, client_config, learner_config, store_config, tiny_policy

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# One backbone: these tests check who teaches and who is judged; averaging backbones is test_detector's.
DETECTOR = DetectorConfig(cameras=("front",), backbone_seeds=(0,), epochs=15, calibration_folds=3, min_labelled=12,
                          min_per_outcome=3, retrain_every=4)
NEVER_SURE = DetectorConfig(**{**DETECTOR.__dict__, "min_margin": 1.0})  # no score lies 1 from its threshold
SEGMENT = 6  # steps per streamed segment: several acks within a short episode
MAX_TICKS = 240


class SceneArm(KinematicRobot):
    """An arm whose camera sees one synthetic "place" episode play out and then stay at its last frame.
    Each frame takes ``frame_s`` of wall time, as a camera's would: the virtual clock otherwise runs an
    episode in less time than a segment takes to be acked."""

    def __init__(self, scene: LabelledEpisode, frame_s: float = 0.01) -> None:
        super().__init__(num_joints=len(JOINTS), fps=30)
        self.joint_names = JOINTS
        self.frames, self.frame_s, self.shown = scene.frames["front"], frame_s, 0

    def get_observation(self):
        time.sleep(self.frame_s)
        frame = self.frames[min(self.shown, len(self.frames) - 1)]
        self.shown += 1
        return {"images": {"front": frame.copy()}, "state": self.state.copy()}


class AnsweringOperator:
    """A person at the keyboard who presses ``answer`` whenever the session asks for a verdict."""

    interactive = True

    def __init__(self, answer: str) -> None:
        self.answer, self.asked = answer, 0

    def poll(self, episode: int, tick: int) -> list[str]:
        if tick >= 0:
            return []
        self.asked += 1
        return [self.answer]

    def close(self) -> None:
        pass


def start_learner(root: Path, detector: DetectorConfig) -> LearnerService:
    """A learner whose "place" detector learnt from 12 operator verdicts, judging on its store's threads."""
    config = learner_config(root)
    config.store = store_config(root / "store", image_height=SIZE, image_width=SIZE, background_commit=True)
    config.detector = detector
    learner = LearnerService(config, tiny_policy(), train=False)
    judging = learner.store.judging
    assert judging is not None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as one_torch_thread: a tiny fit on a shared box
    try:
        fits = [judging.judge.learn(e, VerdictSource.operator) for e in episodes(0, 12)]
    finally:
        torch.set_num_threads(threads)
    assert fits[-1] is not None
    return learner.start()


@pytest.fixture(scope="module")
def learner(tmp_path_factory) -> Iterator[LearnerService]:
    service = start_learner(tmp_path_factory.mktemp("sure"), DETECTOR)
    yield service
    service.stop(checkpoint=False)


def scene(learner: LearnerService, success: bool) -> LabelledEpisode:
    """An episode of that outcome the learner has not seen, which its detector judges right (and is sure
    of, where it can be)."""
    assert learner.store.judging is not None
    judge = learner.store.judging.judge
    for candidate in episodes(5, 10):
        verdict = judge.judge("place", candidate.frames)
        can_be_sure = judge.config.min_margin < 1.0
        if candidate.success == success and verdict is not None and verdict.success == success and (
                verdict.sure or not can_be_sure):
            return candidate
    raise AssertionError("the detector judges none of the unseen episodes right")


def run_session(learner: LearnerService, robot_id: str, shown: LabelledEpisode, keys, tmp_path: Path,
                **settings) -> tuple[SessionResult, str]:
    """One episode at most ``MAX_TICKS`` long in front of ``shown``, streamed to ``learner``: the
    session's result and what it said."""
    robot = SceneArm(shown)
    client = client_config(robot_id, learner, tmp_path / "spool", features={
        "fps": 30, "joint_names": list(JOINTS), "cameras": {"front": [SIZE, SIZE]}})
    runtime = EdgeRuntime(robot, EncodingPolicy(), VirtualClock(), EdgeConfig(fps=30), robot_id=robot_id,
                          client=client, segment_steps=SEGMENT, image_encoding=ImageEncoding("png"))
    hook = TeleopIntervention(null_teleop(NoTeleopConfig(), robot), TakeoverBlender(30, 0.5, 5.0))
    hook.bind(runtime.node)
    said = tmp_path / f"{robot_id}.txt"
    config = SessionConfig(episodes=1, max_episode_steps=MAX_TICKS, reset_time_s=0.0, instruction="place",
                           realtime=False, **settings)
    try:
        assert runtime.start(10.0)
        with said.open("w") as out:
            result = OperatorSession(config, robot, runtime, hook, keys, VirtualClock(),
                                     status=StatusLine(out, interval_s=1e9)).run()
    finally:
        runtime.close(ack_timeout_s=10.0)
    return result, said.read_text()


def run_unattended(learner: LearnerService, robot_id: str, shown: LabelledEpisode, truth: bool,
                   plan: UnattendedVerdicts, tmp_path: Path, episode_id: int = 0) -> Episode:
    """One episode judged as the main job's ``run.verdicts=detector`` judges it, in front of ``shown``;
    ``truth``: what the sim's ground truth says (only the operator reads it)."""
    robot = SceneArm(shown)
    client = client_config(robot_id, learner, tmp_path / "spool", features={
        "fps": 30, "joint_names": list(JOINTS), "cameras": {"front": [SIZE, SIZE]}})
    runtime = EdgeRuntime(robot, EncodingPolicy(), VirtualClock(), EdgeConfig(fps=30), robot_id=robot_id,
                          client=client, segment_steps=SEGMENT, image_encoding=ImageEncoding("png"))
    try:
        assert runtime.start(10.0)
        episode = run_judged_episode(runtime, lambda: truth, plan, MAX_TICKS, "place", episode_id=episode_id,
                                     seed=None)
        assert runtime.wait_acked(10.0)
    finally:
        runtime.close(ack_timeout_s=10.0)
    return episode


def stored(learner: LearnerService, robot_id: str) -> list[tuple[int, bool, str, float]]:
    """(ticks, success, who judged, confidence) of each episode the learner stored for ``robot_id``."""
    assert learner.store.flush(60)
    root = Path(learner.config.store.root)
    lines = (root / "ledger.jsonl").read_text().splitlines()
    owner = {r.index: r.robot_id for r in (CommitRecord.from_json(d) for d in map(json.loads, lines)
                                           if d["op"] == "commit")}
    return [(len(e["action"]), bool(e["next.success"][-1]), SUCCESS_SOURCES[int(e["next.success_source"][-1])],
             float(e["next.success_confidence"][-1]))
            for e in load_episode_arrays(root / "dataset", learner.config.store.repo_id)
            if owner[e["episode_index"]] == robot_id]


def test_the_acks_bring_the_detectors_guess_and_a_sure_success_ends_the_episode(learner, tmp_path):
    result, said = run_session(learner, "arm-done", scene(learner, success=True), NoKeys(), tmp_path)
    assert result.episodes_recorded == 1 and result.detector_verdicts == 1 and result.asked == 0
    assert "the success detector is sure it succeeded" in said
    [(ticks, success, source, confidence)] = stored(learner, "arm-done")
    assert ticks < MAX_TICKS and success and source == VerdictSource.detector  # ended early, the detector's verdict
    assert 0.5 <= confidence <= 1.0


def test_a_sure_detector_gives_the_verdict_at_the_end_and_nobody_is_asked(learner, tmp_path):
    operator = AnsweringOperator("f")  # would call it a failure, if asked
    result, said = run_session(learner, "arm-timed", scene(learner, success=True), operator, tmp_path,
                               end_on_detected_success=False)
    assert operator.asked == 0 and result.asked == 0 and result.detector_verdicts == 1
    assert "nobody asked" in said and "operator asked for 0 of 1 verdicts (0 %)" in said
    [(ticks, success, source, confidence)] = stored(learner, "arm-timed")
    assert ticks == MAX_TICKS and success and source == VerdictSource.detector and 0.5 <= confidence <= 1.0


def test_an_unattended_robots_first_episodes_are_labelled_by_the_operator_from_the_ground_truth(learner, tmp_path):
    episode = run_unattended(learner, "sim-labelled", scene(learner, success=True), True,
                             UnattendedVerdicts(labelled=1, wait_s=2.0), tmp_path)
    assert episode.success and not episode.asked and episode.num_steps == 1  # the operator saw it done at once
    assert stored(learner, "sim-labelled") == [(1, True, VerdictSource.operator, 1.0)]


def test_an_unattended_robot_ends_on_the_detectors_sure_success_and_stores_its_verdict_not_the_sims(learner,
                                                                                                 tmp_path):
    episode = run_unattended(learner, "sim-unattended", scene(learner, success=True), False,
                             UnattendedVerdicts(labelled=1, wait_s=2.0), tmp_path, episode_id=1)
    assert not episode.success and episode.verdict_success and not episode.asked  # the sim says otherwise
    [(ticks, success, source, confidence)] = stored(learner, "sim-unattended")
    assert ticks < MAX_TICKS and success and source == VerdictSource.detector and 0.5 <= confidence <= 1.0


def test_an_unsure_detector_asks_shows_its_guess_and_the_operators_answer_is_stored_and_teaches_it(tmp_path):
    learner = start_learner(tmp_path / "unsure", NEVER_SURE)
    try:
        judging = learner.store.judging
        assert judging is not None and judging.judge.labelled("place") == 12
        operator = AnsweringOperator("f")  # overrides the detector's guess of a success
        result, said = run_session(learner, "arm-asked", scene(learner, success=True), operator, tmp_path)
        assert operator.asked == 1 and result.asked == 1 and result.detector_verdicts == 0
        assert "the success detector guesses success" in said and "unsure" in said
        assert "operator asked for 1 of 1 verdicts (100 %)" in said
        assert stored(learner, "arm-asked") == [(MAX_TICKS, False, VerdictSource.operator, 1.0)]
        judging.wait_fits()
        assert judging.judge.labelled("place") == 13  # the operator's answer is in the detector's training set
        # A robot left alone asks its operator too, who answers from the sim's ground truth.
        episode = run_unattended(learner, "sim-asked", scene(learner, success=True), False,
                                 UnattendedVerdicts(labelled=0, wait_s=2.0), tmp_path)
        assert episode.asked and not episode.verdict_success and episode.num_steps == MAX_TICKS
        assert stored(learner, "sim-asked") == [(MAX_TICKS, False, VerdictSource.operator, 1.0)]
        judging.wait_fits()
        assert judging.judge.labelled("place") == 14
    finally:
        learner.stop(checkpoint=False)
    # Started again on its store, the learner's detector has every verdict it was given; nobody is asked anew.
    with LearnerService(learner.config, tiny_policy(), train=False) as again:
        assert again.store.judging is not None
        again.store.judging.wait_fits()
        assert again.store.judging.judge.labelled("place") == 14
        assert again.store.judging.judge.detector("place") is not None


def test_an_ack_carries_a_guess_or_none_and_a_malformed_one_is_refused():
    plain = Ack(robot_id="arm", episode_id=7, seq=3)
    assert guess_of(decode_message(encode_message(plain))) is None  # no trained detector: no guess
    guessed = decode_message(encode_message(Ack(robot_id="arm", episode_id=7, seq=3, verdict={
        "success": True, "confidence": 0.9, "sure": True})))
    assert isinstance(guessed, Ack)
    guess = guess_of(guessed)
    assert guess is not None and (guess.episode_id, guess.success, guess.confidence, guess.sure) == (7, True, 0.9, True)
    for bad in ({"success": True}, {"success": 1, "confidence": 0.9, "sure": True},
                {"success": True, "confidence": 1.5, "sure": False}):
        with pytest.raises(ProtocolError, match="ack.verdict"):
            decode_message(encode_message(Ack(robot_id="arm", episode_id=7, seq=3, verdict=bad)))
