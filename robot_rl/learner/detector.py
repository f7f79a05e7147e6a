"""A success detector per task: LeRobot's reward classifier trained on the verdicts people give.

A robot left alone has no one to say whether its episode succeeded; the recipes that weigh
outcomes (``rwr``, ``awr``, ``rl``) then have nothing to weigh. This module learns, per task, to
judge an episode's outcome from its camera frames, the way HIL-SERL's classifier does, from what
operators already give:

* **Samples.** The last ``verdict_frames`` frames of a success are positives; those of a failure
  (an e-stop is one) are negatives; so are a few frames from the first part of any episode (the
  task was not done yet) and the frames just before each human takeover (RLIF: the policy was
  going wrong there). Each frame is paired with the episode's first frame of the same camera
  (``compare_with_start``): whether a cube was pushed 5 cm shows only against where it started.
* **Model.** ``lerobot.rewards.classifier.Classifier``: a frozen CNN backbone, a learned spatial
  embedding per image, an MLP head. Its default backbone (``lerobot/resnet10``) comes from the
  Hub, which a robot cell may not reach; a small HuggingFace ResNet with seeded weights is written
  to a temporary dir instead. LeRobot's classifier runs its whole per-image encoder under
  ``no_grad``, which would leave its learned spatial embedding at its random start; here only the
  backbone is (``_FrozenBackboneClassifier``). Random weights keep some features and lose others,
  so a detector holds one backbone per ``backbone_seeds`` entry (a ``_Member``, with its own heads)
  and averages their scores.
* **Calibration.** Every labelled episode is scored by a head fit without it
  (``calibration_folds``-fold cross-validation, folds stratified by outcome): on these out-of-fold
  scores the threshold is set (``calibrated_threshold``: a logistic fit of the outcomes on the
  scores) and a ``margin`` found: beyond it from the threshold, the episodes were judged at least
  ``sure_accuracy`` right. A verdict inside the margin is not ``sure``: a person should be asked. A
  held-out split would set both on a few failures (a fifth of a task's episodes may be failures);
  out of fold, on all of them. The frozen backbone's features are computed once and shared by the
  folds, so a fold costs one head fit. A head is then fit on all labelled episodes, and a verdict's
  score is the mean of its probability and the fold heads': that head alone scores on another scale
  than the fold heads the threshold was set on (trained on a fifth more, it is surer): on the push
  bench at 50 labelled episodes it alone judged 91.7 % of the test scenes right, the mean 100 %.
  With several backbones, the out-of-fold scores and a verdict's score are the means over them.

    >>> detector = TaskDetector(DetectorConfig())
    >>> calibration = detector.fit(labelled_episodes)        # LabelledEpisode(task, frames, success)
    >>> verdict = detector.predict(episode_frames)           # camera -> uint8 [T, H, W, 3]
    >>> verdict.success, verdict.confidence, verdict.sure

torch, LeRobot and transformers are imported at module level: the learner imports this module when it
first fits a task's detector (``SuccessJudge``), not at its start; what the detector reads and says
(episodes, samples, verdicts) is in ``robot_rl.learner.detector_episodes``.
"""

from __future__ import annotations

import copy
import logging
import math
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.rewards.classifier import RewardClassifierConfig
from lerobot.rewards.classifier.modeling_classifier import Classifier
from lerobot.rewards.classifier.processor_classifier import make_classifier_processor
from lerobot.utils.constants import REWARD
from scipy.special import expit
from sklearn.linear_model import LogisticRegression
from transformers import ResNetConfig, ResNetModel

from robot_rl.learner.detector_config import DetectorConfig
from robot_rl.learner.detector_episodes import (
    Calibration,
    LabelledEpisode,
    PreparedEpisode,
    TrainingSamples,
    Verdict,
    input_keys,
    prepare,
    verdict_inputs,
)

log = logging.getLogger(__name__)

FEATURE_CHUNK = 256  # images per pass of the frozen backbone over the training set


# ---------------------------------------------------------------- the classifier


@dataclass(frozen=True)
class BackboneFeatures:
    """The frozen backbone's output for a batch of images, computed once per fit: what LeRobot's
    spatial embedding reads (``last_hidden_state``: [N, C, 4, 4])."""

    last_hidden_state: torch.Tensor


class _FrozenBackboneClassifier(Classifier):
    """LeRobot's classifier with only its backbone frozen: its per-image spatial embedding learns too
    (the parent runs the whole per-image encoder under ``no_grad``). An input may be the backbone's
    output already (``BackboneFeatures``): training runs the frozen backbone once per image, not once
    per epoch."""

    def _get_encoder_output(self, x: torch.Tensor | BackboneFeatures, image_key: str) -> torch.Tensor:
        features = x if isinstance(x, BackboneFeatures) else self.backbone_features(x)
        return self.encoders[image_key][1:](features)

    def backbone_features(self, x: torch.Tensor) -> BackboneFeatures:
        with torch.no_grad():
            return BackboneFeatures(self.encoder(x).last_hidden_state)


def build_classifier(config: DetectorConfig, backbone_seed: int) -> _FrozenBackboneClassifier:
    """The classifier with a seeded small ResNet backbone, written to (and read from) a local dir."""
    # Passed as a dict: transformers' type hints do not name ResNetConfig's own keywords.
    settings: dict[str, Any] = {"num_channels": 3, "embedding_size": config.backbone_channels[0],
                                "hidden_sizes": list(config.backbone_channels),
                                "depths": [1] * len(config.backbone_channels), "layer_type": "basic",
                                "downsample_in_first_stage": False}
    backbone = ResNetConfig(**settings)
    shape = (3, config.image_size, config.image_size)
    keys = input_keys(config)
    with tempfile.TemporaryDirectory(prefix="detector-backbone-") as directory:
        with torch.random.fork_rng():
            torch.manual_seed(backbone_seed)
            ResNetModel(backbone).save_pretrained(directory)
        classifier_config = RewardClassifierConfig(
            model_name=directory, model_type="cnn", num_cameras=len(keys), latent_dim=config.latent_dim,
            hidden_dim=config.hidden_dim, dropout_rate=config.dropout, device="cpu",
            input_features={key: PolicyFeature(type=FeatureType.VISUAL, shape=shape) for key in keys})
        with torch.random.fork_rng():
            torch.manual_seed(config.seed)
            return _FrozenBackboneClassifier(classifier_config)


def _image_stats(samples: TrainingSamples) -> dict[str, dict[str, torch.Tensor]]:
    """Per-input channel mean and std of the training frames (in [0, 1]), which LeRobot's processor normalizes by."""
    stats = {}
    for key, images in samples.images.items():
        pixels = images.reshape(-1, 3).astype(np.float64) / 255.0
        stats[key] = {"mean": torch.tensor(pixels.mean(0), dtype=torch.float32).view(3, 1, 1),
                      "std": torch.tensor(np.maximum(pixels.std(0), 1e-3), dtype=torch.float32).view(3, 1, 1)}
    return stats


def _batch(images: Mapping[str, np.ndarray], index: np.ndarray) -> dict[str, torch.Tensor]:
    return {key: torch.from_numpy(value[index]).permute(0, 3, 1, 2).float() / 255.0 for key, value in images.items()}


# ---------------------------------------------------------------- calibration


def calibrated_threshold(scores: np.ndarray, outcomes: np.ndarray) -> float:
    """The score at which these episodes' outcomes are as likely as not, by a logistic fit of the
    outcomes on the scores' logits (Platt scaling); 0.5 when they hold one outcome only, or when
    higher scores do not mean success more often.

    Not the threshold with the best (balanced) accuracy on these episodes: that one lands at the edge of
    whichever gap a few stray scores leave, and weighing each outcome to a half counts a rare failure
    several times over. On push (50 labelled, out-of-fold scores), two failures scored like successes
    set it at 0.73, above a quarter of the unseen successes (73 % judged right); the fit uses every
    score's distance, at the outcomes' own shares, which are the shares a robot then produces: 97 %.
    """
    outcomes = outcomes.astype(bool)
    if outcomes.all() or not outcomes.any():
        return 0.5
    # sklearn's default L2 penalty keeps the fit finite where the scores separate the outcomes
    fit = LogisticRegression().fit(_logit(scores)[:, None], outcomes)
    slope, intercept = float(fit.coef_[0, 0]), float(fit.intercept_[0])
    if slope <= 0:
        return 0.5
    return float(expit(-intercept / slope))  # no overflow where a near-flat fit puts it far out


def _logit(probabilities: np.ndarray) -> np.ndarray:
    clipped = np.clip(probabilities, 1e-6, 1 - 1e-6)
    return np.log(clipped / (1 - clipped))


def sure_margin(scores: np.ndarray, outcomes: np.ndarray, threshold: float, config: DetectorConfig) -> float:
    """The smallest distance from the threshold beyond which these verdicts were at least
    ``sure_accuracy`` right (never below ``min_margin``; inf where no distance is)."""
    if not len(scores):
        return math.inf
    distance = np.abs(scores - threshold)
    right = (scores >= threshold) == outcomes.astype(bool)
    for margin in np.sort(distance):
        beyond = distance >= margin
        if right[beyond].mean() >= config.sure_accuracy:
            return max(float(margin), config.min_margin)
    return math.inf


def calibration_folds(outcomes: Sequence[bool] | np.ndarray, config: DetectorConfig) -> np.ndarray:
    """Each episode's fold (int [N]): ``calibration_folds`` folds, or one per episode when there are
    fewer. Each outcome is dealt round the folds in an order drawn with ``config.seed``, so no fold
    holds all of an outcome's episodes while it has two or more: every fold's head learns both."""
    flags = np.asarray(outcomes, dtype=bool)
    count = min(config.calibration_folds, len(flags))
    rng = np.random.default_rng(config.seed)
    folds = np.zeros(len(flags), dtype=np.int64)
    dealt = 0
    for value in (False, True):  # failures first: the scarcer outcome spreads evenly whatever the count
        members = rng.permutation(np.flatnonzero(flags == value))
        folds[members] = (dealt + np.arange(len(members))) % count
        dealt += len(members)
    return folds


def cross_validated_accuracy(scores: np.ndarray, outcomes: np.ndarray, folds: np.ndarray) -> float:
    """Share of episodes judged right when each fold's out-of-fold scores meet the threshold set on
    the other folds' (their verdicts only): the threshold never saw the verdicts it is judged on."""
    outcomes = outcomes.astype(bool)
    right = np.zeros(len(scores), dtype=bool)
    for fold in np.unique(folds):
        inside = folds == fold
        threshold = calibrated_threshold(scores[~inside], outcomes[~inside]) if (~inside).any() else 0.5
        right[inside] = (scores[inside] >= threshold) == outcomes[inside]
    return float(right.mean())


# ---------------------------------------------------------------- one task's detector


@dataclass(frozen=True)
class _Features:
    """Backbone features of many episodes' images (input key -> [N, C, 4, 4]) and whose each row is."""

    by_key: dict[str, torch.Tensor]
    episode: np.ndarray  # int [N]: the episode each row came from

    def rows(self, episodes: np.ndarray) -> np.ndarray:
        """The rows of these episodes (bool [number of episodes])."""
        return np.flatnonzero(episodes[self.episode])


@dataclass
class _Member:
    """One random backbone's part of a detector: its input normalizer and the heads that read its features
    (one per calibration fold, then the one fit on all labelled episodes)."""

    preprocess: Any
    heads: list[_FrozenBackboneClassifier]

    def score(self, images: Mapping[str, np.ndarray], config: DetectorConfig) -> float:
        """The heads' probability of success, averaged over the heads and the images' rows."""
        index = np.arange(len(next(iter(images.values()))))
        with torch.no_grad():
            batch = self.preprocess(_batch(images, index))
            # The heads share the frozen backbone: it runs once, each head reads its features.
            features = [self.heads[0].backbone_features(batch[key]) for key in input_keys(config)]
            return float(np.mean([head.predict(features).probabilities.mean().item() for head in self.heads]))


def _fit_member(prepared: Sequence[PreparedEpisode], folds: np.ndarray, backbone_seed: int,
                config: DetectorConfig) -> tuple[_Member, np.ndarray]:
    """The heads on one random backbone, and each episode's score from the head fit without its fold."""
    samples = TrainingSamples.concat([e.samples for e in prepared])
    model = build_classifier(config, backbone_seed)
    # Normalized by the pixel statistics of all the episodes, in every fold as in the final head: they
    # know no verdict, and one set of them lets the backbone run once for all the folds.
    preprocess, _ = make_classifier_processor(model.config, _image_stats(samples))
    model.eval()
    sample_features = _backbone_features(model, preprocess, samples.images, [len(e.samples.labels) for e in prepared])
    verdict_features = _backbone_features(model, preprocess, _concat_images([e.verdict_inputs for e in prepared]),
                                          [len(next(iter(e.verdict_inputs.values()))) for e in prepared])
    scores = np.zeros(len(prepared))
    heads = []
    for fold in [*range(folds.max() + 1), None]:  # None: the head fit on all of them
        head = copy.deepcopy(model)  # each head starts where the untrained classifier does
        _train_head(head, sample_features, samples.labels, np.ones(len(prepared), dtype=bool) if fold is None
                    else folds != fold, config)
        if fold is not None:
            scores[folds == fold] = _episode_scores(head, verdict_features, folds == fold, config)
        heads.append(head)
    return _Member(preprocess, heads), scores


class TaskDetector:
    """One task's success detector: fit on labelled episodes, then judge episodes' frames."""

    def __init__(self, config: DetectorConfig) -> None:
        self.config = config
        # One per backbone in ``backbone_seeds``, each with its heads; their scores are averaged (module doc).
        self.members: list[_Member] = []
        self.calibration: Calibration | None = None

    @property
    def trained(self) -> bool:
        return bool(self.members) and self.calibration is not None

    def fit(self, episodes: Sequence[LabelledEpisode | PreparedEpisode]) -> Calibration:
        """Calibrate on out-of-fold scores, then fit a head on all the episodes too (module doc)."""
        if len(episodes) < 2:
            raise ValueError(f"the success detector needs two or more labelled episodes, got {len(episodes)}")
        config = self.config
        prepared = [e if isinstance(e, PreparedEpisode) else prepare(e, config) for e in episodes]
        outcomes = np.array([e.success for e in prepared])
        folds = calibration_folds(outcomes, config)
        members, scores = [], np.zeros(len(prepared))
        for backbone_seed in config.backbone_seeds:
            member, member_scores = _fit_member(prepared, folds, backbone_seed, config)
            members.append(member)
            scores += member_scores / len(config.backbone_seeds)
        threshold = calibrated_threshold(scores, outcomes)
        self.members = members
        self.calibration = Calibration(threshold, sure_margin(scores, outcomes, threshold, config),
                                       cross_validated_accuracy(scores, outcomes, folds), len(prepared),
                                       len(prepared), int(folds.max() + 1))
        return self.calibration

    def score(self, frames: Mapping[str, np.ndarray]) -> float:
        """The probability of success, averaged over the backbones, their heads and the episode's last frames."""
        return self._score_inputs(verdict_inputs(frames, self.config))

    def _score_inputs(self, images: Mapping[str, np.ndarray]) -> float:
        if not self.members:
            raise RuntimeError("this success detector is not trained yet")
        return float(np.mean([member.score(images, self.config) for member in self.members]))

    def score_prepared(self, episode: PreparedEpisode) -> float:
        """``score`` of an episode already prepared (its frames resized once)."""
        return self._score_inputs(episode.verdict_inputs)

    def predict(self, frames: Mapping[str, np.ndarray]) -> Verdict:
        """The verdict on one episode from its frames (camera -> uint8 [T, H, W, 3])."""
        return self.verdict(self.score(frames))

    def verdict(self, score: float) -> Verdict:
        """The verdict a score stands for, by the calibrated threshold and margin."""
        if self.calibration is None:
            raise RuntimeError("this success detector is not trained yet")
        threshold = self.calibration.threshold
        success = score >= threshold
        # The classifier's probability, rescaled so that the calibrated threshold sits at 0.5 (out-of-fold
        # scores set the threshold, not the training loss): 0.5 at it, 1 at the far end of its side.
        side = (score - threshold) / (1.0 - threshold) if success else (threshold - score) / threshold
        return Verdict(success=success, confidence=0.5 + 0.5 * min(max(side, 0.0), 1.0),
                       sure=abs(score - threshold) >= self.calibration.margin, score=score)


def _concat_images(parts: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}


def _backbone_features(model: _FrozenBackboneClassifier, preprocess: Any, images: Mapping[str, np.ndarray],
                       rows_per_episode: Sequence[int]) -> _Features:
    """Every image through the normalizer and the frozen backbone, once per fit."""
    total = sum(rows_per_episode)
    chunks: dict[str, list[torch.Tensor]] = {key: [] for key in images}
    for start in range(0, total, FEATURE_CHUNK):
        batch = preprocess(_batch(images, np.arange(start, min(start + FEATURE_CHUNK, total))))
        for key in images:
            chunks[key].append(model.backbone_features(batch[key]).last_hidden_state)
    return _Features({key: torch.cat(parts) for key, parts in chunks.items()},
                     np.repeat(np.arange(len(rows_per_episode)), rows_per_episode))


def _train_head(model: _FrozenBackboneClassifier, features: _Features, labels: np.ndarray, episodes: np.ndarray,
                config: DetectorConfig) -> None:
    """Train the classifier's trainable part on the samples of ``episodes`` (bool [number of episodes])."""
    rows = features.rows(episodes)
    positives = labels[rows] > 0.5
    # Each outcome weighs half of every epoch, however few successes (or failures) there are.
    weights = np.where(positives, 0.5 / max(positives.sum(), 1), 0.5 / max((~positives).sum(), 1))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    rng = np.random.default_rng(config.seed)
    all_labels = torch.from_numpy(labels)
    model.train()
    with torch.random.fork_rng():
        torch.manual_seed(config.seed)  # dropout: the same episodes give the same head
        for _ in range(config.epochs):
            order = rows[rng.choice(len(rows), size=len(rows), p=weights / weights.sum())]
            for start in range(0, len(order), config.batch_size):
                index = torch.from_numpy(order[start:start + config.batch_size])
                batch = {key: BackboneFeatures(value[index]) for key, value in features.by_key.items()}
                loss, _ = model({**batch, REWARD: all_labels[index]})
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, model.config.grad_clip_norm)
                optimizer.step()
    model.eval()


def _episode_scores(model: _FrozenBackboneClassifier, features: _Features, episodes: np.ndarray,
                    config: DetectorConfig) -> np.ndarray:
    """The classifier's probability of success, averaged over each of ``episodes``' verdict frames."""
    rows = features.rows(episodes)
    with torch.no_grad():
        inputs = [BackboneFeatures(features.by_key[key][rows]) for key in input_keys(config)]
        probabilities = model.predict(inputs).probabilities.numpy()
    owners = features.episode[rows]
    wanted = np.flatnonzero(episodes)
    return np.bincount(owners, probabilities, minlength=len(episodes))[wanted] / np.bincount(
        owners, minlength=len(episodes))[wanted]
