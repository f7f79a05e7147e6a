"""SuccessJudge (robot_rl.learner.judge): per-task detectors fit online from the verdicts that arrive;
an episode nobody judged gets the detector's verdict once its task has one."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from robot_rl.learner.detector_config import DetectorConfig
from robot_rl.learner.detector_episodes import IMAGE_KEY_PREFIX, input_keys, prepare
from robot_rl.learner.judge import SuccessJudge, VerdictSource
from robot_rl.learner.judging import make_judging
from robot_rl.learner.labelled_files import LabelledEpisodeFiles
from tests.detector_helpers import episodes, one_torch_thread  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REPO = Path(__file__).resolve().parent.parent

# One backbone: these tests check who teaches and who is judged; averaging backbones is test_detector's.
CONFIG = DetectorConfig(cameras=("front",), backbone_seeds=(0,), epochs=15, calibration_folds=3, min_labelled=12,
                        min_per_outcome=3, retrain_every=4)


def test_operators_verdicts_train_the_detector_that_then_judges_unjudged_episodes():
    judge = SuccessJudge(CONFIG)
    unseen = episodes(1, 40)
    assert judge.judge("place", unseen[0].frames) is None  # no verdicts yet: nothing to judge with
    fits = [judge.learn(episode, VerdictSource.operator) for episode in episodes(0, 32)]
    assert [i for i, fit in enumerate(fits) if fit is not None] == [11, 15, 19, 23, 27, 31]  # at 12, then every 4 more
    calibration = judge.calibrations()["place"]  # the last fit: every verdict scored out of fold, then learned
    assert calibration.heldout_episodes == calibration.trained_episodes == 32
    verdicts = [judge.judge("place", e.frames) for e in unseen]
    assert all(v is not None for v in verdicts)
    # Far above chance, not an exact score: the fit's float sums differ between CPUs, and a detector
    # from 32 episodes lands between 78 % and 100 % across seeds. 28 of 40 by chance has p < 0.01.
    assert np.mean([v.success == e.success for v, e in zip(verdicts, unseen, strict=True)]) >= 0.7
    assert judge.judge("pick", unseen[0].frames) is None  # another task: its own detector, none yet


def test_no_detector_is_fit_until_both_outcomes_have_enough_verdicts():
    judge = SuccessJudge(CONFIG)
    successes = [e for e in episodes(0, 24) if e.success]
    assert all(judge.learn(e, VerdictSource.task) is None for e in successes)
    assert judge.labelled("place") == 12 and judge.detector("place") is None


def test_a_detectors_own_verdict_never_trains_it():
    judge = SuccessJudge(CONFIG)
    with pytest.raises(ValueError, match="cannot train the detector"):
        judge.learn(episodes(0, 1)[0], VerdictSource.detector)
    assert judge.labelled("place") == 0


def test_a_restarted_learner_s_judge_takes_back_its_labelled_episodes_and_judges_as_before(tmp_path):
    before = make_judging(CONFIG, background=False, keep_in=tmp_path / "judged")
    assert before is not None
    for episode in episodes(0, 16):  # fit at 12, then on all 16
        before.judge.learn(episode, VerdictSource.operator)
    detector = before.judge.detector("place")
    assert detector is not None
    before.close()

    after = make_judging(CONFIG, background=False, keep_in=tmp_path / "judged")  # the learner started again
    assert after is not None
    after.wait_fits()
    restored = after.judge.detector("place")
    assert restored is not None and after.judge.labelled("place") == 16
    assert restored.calibration == detector.calibration  # fit on the very frames, bit for bit
    unseen = episodes(1, 6)
    assert [restored.score(e.frames) for e in unseen] == pytest.approx([detector.score(e.frames) for e in unseen],
                                                                        abs=1e-6)
    after.close()


def test_only_the_newest_labelled_episodes_per_task_stay_on_disk(tmp_path):
    files = LabelledEpisodeFiles(tmp_path, CONFIG, keep=3)
    learnt = [prepare(e, CONFIG) for e in episodes(0, 5)]
    for episode in learnt:
        files.save("place", episode)
    files.save("pick", learnt[0])
    assert len(list(tmp_path.glob("*.npz"))) == 4  # three of place's five, pick's one
    loaded = LabelledEpisodeFiles(tmp_path, CONFIG, keep=3).load()
    assert [e.success for e in loaded["place"]] == [e.success for e in learnt[2:]]
    frames = input_keys(CONFIG)[0]
    assert np.array_equal(loaded["place"][-1].verdict_inputs[frames], learnt[-1].verdict_inputs[frames])
    assert len(loaded["pick"]) == 1


def test_a_damaged_file_or_one_prepared_for_other_settings_is_left_out_and_said(tmp_path, caplog):
    files = LabelledEpisodeFiles(tmp_path, CONFIG, keep=10)
    kept = [files.save("place", prepare(e, CONFIG)) for e in episodes(0, 3)]
    kept[0].write_bytes(kept[0].read_bytes()[:100])  # a crash of the disk, not of ours: truncated
    other = dataclasses.replace(CONFIG, backbone_channels=(16, 32, 64, 64))  # 128x128 frames
    LabelledEpisodeFiles(tmp_path, other, keep=10).save("place", prepare(episodes(2, 1)[0], other))
    with caplog.at_level("WARNING"):
        loaded = LabelledEpisodeFiles(tmp_path, CONFIG, keep=10).load()
    assert len(loaded["place"]) == 2
    assert "do not read" in caplog.text and kept[0].name in caplog.text
    assert "other detector settings" in caplog.text


def test_a_learner_starts_without_the_detector_model_and_loads_it_at_a_tasks_first_fit():
    """The model's libraries (LeRobot's classifier, transformers, scikit-learn) cost a learner 6-7 s of CPU
    to import: a start, and a restart after a crash, would wait for them although no task has verdicts yet."""
    probe = ("import sys, json; import robot_rl.learner.service; "
             "from robot_rl.learner.detector_config import DetectorConfig; "
             "from robot_rl.learner.judge import SuccessJudge, VerdictSource; "
             "from tests.detector_helpers import episodes; "
             "config = DetectorConfig(cameras=('front',), backbone_seeds=(0,), epochs=1, calibration_folds=3, "
             "min_labelled=6, min_per_outcome=2); judge = SuccessJudge(config); "
             "loaded = lambda: [m for m in ('lerobot.rewards', 'transformers', 'sklearn') if m in sys.modules]; "
             "at_start = loaded(); fits = [judge.learn(e, VerdictSource.operator) for e in episodes(0, 6)]; "
             "print(json.dumps([at_start, loaded(), fits[-1] is not None]))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                            cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert result.returncode == 0, result.stderr[-3000:]
    at_start, after_fit, fitted = json.loads(result.stdout.strip().splitlines()[-1])
    assert at_start == [] and fitted
    assert after_fit == ["lerobot.rewards", "transformers", "sklearn"]


def test_the_detectors_image_inputs_are_named_as_lerobots_classifier_reads_them():
    from lerobot.utils.constants import OBS_IMAGE

    assert IMAGE_KEY_PREFIX == OBS_IMAGE
