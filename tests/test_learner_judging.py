"""The learner judges: an episode nobody judged is stored with its task's success detector's verdict,
an operator's verdict is stored as the operator's and teaches the detector, and training weighs a
detector's verdict by its confidence while a person's or the task's counts as before."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

from robot_rl.bridges.zmq.protocol import ProtocolError
from robot_rl.bridges.zmq.segments import ImageEncoding, decode_segment, encode_segment
from robot_rl.core.types import UNJUDGED, Step, VerdictSource, source_code
from robot_rl.data.reader import load_episode_arrays
from robot_rl.learner.algorithms.config import RejectionConfig, RWRConfig
from robot_rl.learner.algorithms.rwr import ONLINE, rejection_factors, rwr_weights, verdict_factors
from robot_rl.learner.config import RewardConfig
from robot_rl.learner.detector_config import DetectorConfig
from robot_rl.learner.detector_episodes import LabelledEpisode
from robot_rl.learner.index import SampleSpec
from robot_rl.learner.judge import SuccessJudge
from robot_rl.learner.judging import EpisodeJudging, task_of
from robot_rl.learner.rewards import episode_rewards
from robot_rl.learner.store import ReplayStore
from tests.detector_helpers import SIZE, episodes, one_torch_thread  # noqa: F401 (a fixture)
from tests.learner_helpers import JOINTS, store_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# One backbone: these tests check who teaches and who is judged; averaging backbones is test_detector's.
CONFIG = DetectorConfig(cameras=("front",), backbone_seeds=(0,), epochs=15, calibration_folds=3, min_labelled=12,
                        min_per_outcome=3, retrain_every=4)
PNG = ImageEncoding("png")  # lossless: the detector judges the very frames it was given
REPO = "local/robot_rl_replay"


def as_steps(episode: LabelledEpisode, success: bool, source: str, confidence: float) -> list[Step]:
    """A synthetic episode as an edge streams it, its verdict (or none) on its last step."""
    frames = episode.frames["front"]
    steps = [Step(tick=t, time_s=t / 30, state=np.full(len(JOINTS), t, dtype=np.float32),
                  action=np.full(len(JOINTS), t + 1, dtype=np.float32), images={"front": frames[t]},
                  instruction=episode.task, chunk_id=t // 4, success_source=source,
                  success_confidence=confidence) for t in range(len(frames))]
    last = steps[-1]
    last.done, last.success = True, success
    return steps


def send(store: ReplayStore, robot: str, episode_id: int, steps: list[Step]) -> None:
    chunks = [steps[i:i + 4] for i in range(0, len(steps), 4)]
    for seq, chunk in enumerate(chunks):
        store.ingest(encode_segment(robot, episode_id, seq, chunk, episode_done=chunk[-1].done, image_encoding=PNG))


def open_store(root, judging: EpisodeJudging, **config) -> ReplayStore:
    return ReplayStore(store_config(root, image_height=SIZE, image_width=SIZE, **config), judging=judging)


def stored_verdicts(root) -> list[tuple[bool, int, float]]:
    """(success, source code, confidence) of each stored episode's last step, read back with LeRobot."""
    return [(bool(ep["next.success"][-1]), int(ep["next.success_source"][-1]), float(ep["next.success_confidence"][-1]))
            for ep in load_episode_arrays(root / "dataset", REPO)]


def batch_of(store: ReplayStore) -> dict:
    spec = SampleSpec(chunk_size=2, cameras=("front",))
    return store.index.sample(16, {"online": 1.0}, spec, np.random.default_rng(0))


# Inline (tools, tests) and as the learner runs: judged on the store-judge thread, committed on the commit
# thread, written by the writer process (the verdict crosses its pipe).
@pytest.mark.parametrize("background", [False, True], ids=["inline", "threads-and-writer-process"])
def test_an_unattended_episode_is_stored_with_the_detectors_verdict_and_confidence(tmp_path, background):
    judge = SuccessJudge(CONFIG)
    fits = [judge.learn(e, VerdictSource.operator) for e in episodes(0, 12)]
    assert fits[-1] is not None  # a trained detector for "place"
    unseen = episodes(1, 8)
    verdicts = [judge.judge("place", e.frames) for e in unseen]
    # One the detector calls a success: the edge sent it as a failure nobody vouched for.
    pick = next(i for i, v in enumerate(verdicts) if v is not None and v.success)
    expected = verdicts[pick]
    assert expected is not None
    writer = "process" if background else "thread"
    with open_store(tmp_path, EpisodeJudging(judge, background=background), background_commit=background,
                    writer=writer) as store:
        send(store, "arm", 1, as_steps(unseen[pick], success=False, source=UNJUDGED, confidence=0.0))
        assert store.flush()
        batch = batch_of(store)
    [(success, source, confidence)] = stored_verdicts(tmp_path)
    assert success and source == source_code(VerdictSource.detector)
    assert confidence == pytest.approx(expected.confidence, abs=1e-4) and 0.5 <= confidence <= 1.0
    # The sampling index has it too: batches carry the verdict, its source and confidence.
    assert bool(batch["episode_success"].all()) and bool(batch["episode_finished"].all())
    assert (batch["episode_success_source"] == source_code(VerdictSource.detector)).all()
    assert torch.allclose(batch["episode_success_confidence"], torch.tensor(expected.confidence), atol=1e-4)


def test_an_operators_verdict_is_stored_as_such_and_teaches_the_detector(tmp_path):
    judge = SuccessJudge(CONFIG)
    failure, success, unjudged, by_task = episodes(2, 4)  # outcomes alternate: failure first
    judging = EpisodeJudging(judge, background=False)
    with open_store(tmp_path, judging) as store:
        send(store, "arm", 1, as_steps(success, success=True, source=VerdictSource.operator, confidence=1.0))
        send(store, "arm", 2, as_steps(failure, success=False, source=VerdictSource.operator, confidence=1.0))
        send(store, "arm", 3, as_steps(unjudged, success=False, source=UNJUDGED, confidence=0.0))
        send(store, "sim", 1, as_steps(by_task, success=True, source=VerdictSource.task, confidence=1.0))
        assert store.flush()
        judging.wait_fits()
        assert judge.labelled("place") == 2  # the operator's two; nobody's and (by default) the task's teach nothing
        batch = store.index.sample(64, {"online": 1.0}, SampleSpec(chunk_size=2, cameras=("front",)),
                                   np.random.default_rng(0))
    operator, nobody, task = (source_code(s) for s in (VerdictSource.operator, UNJUDGED, VerdictSource.task))
    assert stored_verdicts(tmp_path) == [(True, operator, 1.0), (False, operator, 1.0), (False, nobody, 0.0),
                                         (True, task, 1.0)]
    # No detector yet: the unjudged episode is unknown to training (not finished), the others are judged.
    finished = set(zip(batch["episode_success_source"].tolist(), batch["episode_finished"].tolist(), strict=True))
    assert finished == {(operator, True), (nobody, False), (task, True)}


def test_a_detector_verdicts_confidence_scales_its_rwr_weight_and_an_unsure_one_can_be_left_out():
    detector, task = source_code(VerdictSource.detector), source_code(VerdictSource.task)
    batch = {"stream": torch.full((3,), ONLINE), "episode_success": torch.ones(3, dtype=torch.bool),
             "episode_finished": torch.ones(3, dtype=torch.bool),
             "episode_success_source": torch.tensor([task, detector, detector]),
             "episode_success_confidence": torch.tensor([1.0, 0.9, 0.6])}
    scores = torch.zeros(3)

    def weights(config: RWRConfig) -> torch.Tensor:
        return rwr_weights(scores, batch["stream"], batch["episode_success"], batch["episode_finished"], config,
                           verdict_factors(batch, config.min_detector_confidence))

    weighed = weights(RWRConfig())
    assert weighed[1] / weighed[0] == pytest.approx(0.9) and weighed[2] / weighed[0] == pytest.approx(0.6)
    sure_only = weights(RWRConfig(min_detector_confidence=0.8))
    assert sure_only[2] == 0 and sure_only[1] / sure_only[0] == pytest.approx(0.9)
    # awr's and rl's rejection stage reads the same verdicts.
    kept = rejection_factors(RejectionConfig(min_detector_confidence=0.8), batch)
    assert kept.tolist() == pytest.approx([1.0, 0.9, 0.0])


def test_task_and_operator_verdicts_weigh_exactly_as_before():
    task, operator = source_code(VerdictSource.task), source_code(VerdictSource.operator)
    rng = torch.Generator().manual_seed(0)
    stream = torch.randint(0, 3, (32,), generator=rng)
    success = torch.rand(32, generator=rng) > 0.5
    finished = torch.rand(32, generator=rng) > 0.2
    scores = torch.randn(32, generator=rng)
    batch = {"episode_success_source": torch.where(torch.rand(32, generator=rng) > 0.5, task, operator),
             "episode_success_confidence": torch.ones(32)}
    config = RWRConfig(failures="downweight")
    before = rwr_weights(scores, stream, success, finished, config)  # a batch that says nothing of sources
    after = rwr_weights(scores, stream, success, finished, config, verdict_factors(batch, 0.9))
    assert torch.equal(before, after)


def test_an_episode_nobody_judged_is_unknown_to_the_rewards_not_a_failure():
    ended = {"action": np.zeros((5, 6)), "success": np.zeros(5, bool), "done": np.array([0, 0, 0, 0, 1], bool)}
    config = RewardConfig(failure_reward=-1.0)
    failed = episode_rewards({**ended, "success_confidence": np.ones(5, np.float32)}, config)
    unknown = episode_rewards({**ended, "success_confidence": np.zeros(5, np.float32)}, config)
    assert failed.finished and failed.rewards[-1] == -1.0
    assert not unknown.finished and unknown.rewards[-1] == 0.0
    assert episode_rewards(ended, config).finished  # a dataset recorded before sources: as before


def test_who_judged_crosses_the_wire_and_a_segment_without_it_decodes_as_before():
    steps = as_steps(episodes(3, 1)[0], success=True, source=VerdictSource.operator, confidence=1.0)[-4:]
    segment = encode_segment("arm", 1, 0, steps, episode_done=True, image_encoding=PNG)
    assert [(s.success_source, s.success_confidence) for s in decode_segment(segment)][-1] == ("operator", 1.0)
    for name in ("success_source", "success_confidence"):  # an edge that predates the columns
        del segment.columns[name]
    assert decode_segment(segment)[-1].success_source == VerdictSource.task  # what its success meant then
    segment.columns["success_source"] = ["someone"] * len(steps)
    with pytest.raises(ProtocolError, match="success_source"):
        decode_segment(segment)


def test_the_sims_instructions_share_their_familys_detector_and_any_other_instruction_has_its_own():
    assert {task_of("push the red cube to the left"), task_of("push the blue cube to the right")} == {"push"}
    assert task_of("put the green cube in the bowl") == "place"
    assert task_of("fold the towel") == "fold the towel"  # a real arm's task, as its operator words it
