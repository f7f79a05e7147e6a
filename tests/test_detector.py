"""The success detector (robot_rl.learner.detector): trained on a handful of labelled episodes, it
judges held-out ones; its threshold and sure-margin come from every labelled episode's out-of-fold score."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from robot_rl.learner.detector import (
    TaskDetector,
    _Member,
    calibrated_threshold,
    calibration_folds,
    cross_validated_accuracy,
    sure_margin,
)
from robot_rl.learner.detector_config import DetectorConfig
from robot_rl.learner.detector_episodes import training_samples
from tests.detector_helpers import episodes, one_torch_thread, synthetic_episode  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CONFIG = DetectorConfig(cameras=("front",), epochs=15, calibration_folds=3)


def test_a_detector_trained_on_a_handful_of_episodes_separates_held_out_ones():
    detector = TaskDetector(CONFIG)
    calibration = detector.fit(episodes(0, 32))
    # Every episode is scored out of fold, then the judging head learns from all of them.
    assert calibration.heldout_episodes == calibration.trained_episodes == 32 and calibration.folds == 3
    unseen = episodes(1, 40)
    verdicts = [detector.predict(e.frames) for e in unseen]
    right = [v.success == e.success for v, e in zip(verdicts, unseen, strict=True)]
    # Far above chance rather than an exact score: the fit's float sums differ between CPUs, and a
    # detector from 32 episodes lands between 85 % and 100 % across seeds (28 of 40 by chance: p < 0.01).
    assert np.mean(right) >= 0.7, [(round(v.score, 3), e.success) for v, e in zip(verdicts, unseen, strict=True)]
    for verdict in verdicts:
        assert 0.5 <= verdict.confidence <= 1.0  # the probability of the verdict it gives
    sure = [r for r, v in zip(right, verdicts, strict=True) if v.sure]
    # Most verdicts stand on their own, and those are at least as often right as all of them.
    assert len(sure) >= 20 and np.mean(sure) >= max(0.8, np.mean(right))


def test_samples_take_the_last_frames_with_the_outcome_and_the_frames_before_a_takeover_as_negatives():
    config = DetectorConfig(cameras=("front",), verdict_frames=3, early_negatives=2, takeover_negatives=2,
                            takeover_window=4)
    rng = np.random.default_rng(0)
    plain = training_samples(synthetic_episode(rng, success=True), config)
    assert plain.labels.tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]
    rescued = training_samples(synthetic_episode(rng, success=True, takeover_at=6), config)
    assert rescued.labels.tolist() == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]  # + ticks 2 and 5, before the takeover
    failed = training_samples(synthetic_episode(rng, success=False), config)
    assert failed.labels.sum() == 0.0


def test_the_threshold_and_margin_come_from_the_held_out_scores():
    config = DetectorConfig(sure_accuracy=1.0, min_margin=0.01)
    scores = np.array([0.1, 0.2, 0.35, 0.4, 0.7, 0.9])
    outcomes = np.array([False, False, True, False, True, True])
    threshold = calibrated_threshold(scores, outcomes)
    assert 0.4 < threshold < 0.7  # one error (0.35) either way; the rest separated
    margin = sure_margin(scores, outcomes, threshold, config)
    assert margin > abs(0.35 - threshold)  # the wrongly judged episode lies inside the margin
    assert math.isinf(sure_margin(np.array([0.6]), np.array([False]), 0.5, config))


def _scores_of_a_detector_with_near_misses(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Scores shaped like a push detector's: three successes in four, spread towards 1; failures near
    0, but about one in eight a near miss scored like a success."""
    outcomes = rng.random(count) < 0.75
    scores = np.where(outcomes, rng.beta(4.0, 1.2, count), rng.beta(0.6, 10.0, count))
    near_miss = ~outcomes & (rng.random(count) < 0.12)
    scores[near_miss] = rng.uniform(0.5, 0.9, near_miss.sum())
    return scores, outcomes


def test_a_threshold_set_on_fifty_episodes_judges_unseen_ones_nearly_as_well_as_the_best_one():
    # A few near misses among 50 labelled episodes must not drag the threshold above a share of the
    # successes: on fresh episodes from the same robot, every draw of the 50 judges within 3 points of
    # the best threshold there is (the best balanced accuracy on the 50 fell 12 points short on a draw).
    unseen, unseen_outcomes = _scores_of_a_detector_with_near_misses(np.random.default_rng(0), 20_000)
    best = max(((unseen >= t) == unseen_outcomes).mean() for t in np.linspace(0.0, 1.0, 201))
    accuracies = []
    for draw in range(30):
        scores, outcomes = _scores_of_a_detector_with_near_misses(np.random.default_rng(100 + draw), 50)
        threshold = calibrated_threshold(scores, outcomes)
        accuracies.append(((unseen >= threshold) == unseen_outcomes).mean())
    assert min(accuracies) >= best - 0.03
    assert calibrated_threshold(np.array([0.9, 0.8]), np.array([True, True])) == 0.5  # one outcome: no evidence


def test_folds_deal_each_outcome_round_so_every_folds_head_learns_both():
    outcomes = [True] * 10 + [False] * 2
    folds = calibration_folds(outcomes, DetectorConfig(calibration_folds=5))
    assert sorted(np.bincount(folds)) == [2, 2, 2, 3, 3]  # 12 episodes, as even as they go
    for fold in range(5):
        trained = np.array(outcomes)[folds != fold]
        assert trained.any() and not trained.all()  # the head scoring this fold saw both outcomes
    few = calibration_folds([True, False, True], DetectorConfig(calibration_folds=5))
    assert sorted(few.tolist()) == [0, 1, 2]  # fewer episodes than folds: one fold each


def test_the_threshold_is_set_on_scores_from_heads_that_never_saw_the_episode():
    labelled = episodes(0, 24)
    config = replace(CONFIG, backbone_seeds=(0, 1))
    detector = TaskDetector(config)
    calibration = detector.fit(labelled)
    outcomes = np.array([e.success for e in labelled])
    folds = calibration_folds(outcomes, config)
    assert len(detector.members) == 2  # one per random backbone
    assert all(len(member.heads) == calibration.folds + 1 for member in detector.members)  # a head per fold, one on all
    # Fold f's heads (one per backbone), fit without fold f, scored fold f's episodes: the threshold is
    # the best on their mean.
    out_of_fold = np.array([np.mean([_single_head_score(detector, member, member.heads[fold], e)
                                     for member in detector.members]) for e, fold in zip(labelled, folds, strict=True)])
    assert calibration.threshold == pytest.approx(calibrated_threshold(out_of_fold, outcomes), abs=1e-5)
    # A verdict's score is the mean over the backbones of their heads' mean.
    unseen = episodes(1, 1)[0]
    assert detector.score(unseen.frames) == pytest.approx(
        np.mean([np.mean([_single_head_score(detector, member, head, unseen) for head in member.heads])
                 for member in detector.members]), abs=1e-6)


def _single_head_score(detector: TaskDetector, member: _Member, head, episode) -> float:
    alone = TaskDetector(detector.config)
    alone.members, alone.calibration = [_Member(member.preprocess, [head])], detector.calibration
    return alone.score(episode.frames)


def test_the_reported_accuracy_judges_each_fold_at_a_threshold_set_without_its_verdicts():
    # Two folds separate at 0.5; the third holds a failure at 0.3 and a success at 0.45. Set on all
    # six, the threshold falls between them and judges every one right; the third fold's threshold, set on
    # the other two, is 0.5 and misjudges its success: the estimate does not credit the tuning.
    scores = np.array([0.1, 0.9, 0.2, 0.8, 0.3, 0.45])
    outcomes = np.array([False, True, False, True, False, True])
    folds = np.array([0, 0, 1, 1, 2, 2])
    tuned = calibrated_threshold(scores, outcomes)
    assert ((scores >= tuned) == outcomes).all()
    assert cross_validated_accuracy(scores, outcomes, folds) == pytest.approx(5 / 6)


def test_an_untrained_detector_refuses_to_judge():
    with pytest.raises(RuntimeError, match="not trained"):
        TaskDetector(CONFIG).predict(episodes(0, 1)[0].frames)
