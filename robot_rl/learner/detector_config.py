"""Settings of the success detector (``robot_rl.learner.detector``): what it reads, how it learns,
how sure it must be before its verdict stands in for a person's.

Nothing here imports torch, so a command reads and checks its config in a moment.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DetectorConfig:
    """One success detector per task, on LeRobot's reward classifier (``lerobot.rewards.classifier``)."""

    # The learner judges: the verdicts of ``learn_from`` teach each task's detector (on a thread of its
    # own), and an episode nobody judged gets its task's detector's verdict before it is stored. Until a
    # task has a trained detector this costs a resize of each arriving frame to ``image_size``.
    enabled: bool = True
    # Whose verdicts teach. A person's, by default: the task's exist only in the sim, where every
    # episode has one and a detector would be fit again every ``retrain_every`` episodes for nothing;
    # add "task" to train detectors on the sim's ground truth.
    learn_from: tuple[str, ...] = ("operator",)

    # The frames it judges (all must be recorded). The wrist camera alone: at the end of a push the cube
    # fills a good part of its frame, at a scale the backbone's coarse 4x4 grid keeps; from the front
    # camera the cube is a few pixels at 64x64 and its 5 cm move lies within one cell of that grid. The
    # front frames (two more classifier inputs) added parameters to fit more than signal: on push
    # (`bench detector`, 50 labelled) the front camera alone ranked at ROC-AUC 0.70-0.79, the wrist one
    # at 0.92-0.93, and both together judged worse than the wrist alone (65-92 % against 90-93 %).
    cameras: tuple[str, ...] = ("wrist",)
    # Each camera's current frame is paired with the episode's first one: a push is judged by how far
    # the cube moved, which one frame cannot show. The classifier takes them as two more "cameras".
    compare_with_start: bool = True
    # The frozen CNN backbone (a HuggingFace ResNet written to a local dir; the Hub is not reachable):
    # channels per stage. Each stage after the first halves the grid, and the classifier's spatial
    # embedding wants a 4x4 grid, so the frames are resized to 16 * 2 ** (stages - 1) pixels.
    backbone_channels: tuple[int, ...] = (16, 32, 64)
    # Its weights are drawn, not pretrained, so which features it keeps is a draw: one backbone's accuracy
    # moved by 5 points with its seed (push, 50 labelled). One backbone per seed, each with its own heads;
    # their scores are averaged, which evens the draw out at a fit this many times as long.
    backbone_seeds: tuple[int, ...] = (0, 1, 2)
    latent_dim: int = 64  # per-camera embedding of the classifier
    hidden_dim: int = 64  # its MLP head
    dropout: float = 0.1
    # Frames per episode that carry its verdict: the last few of a success are positives, the last few
    # of a failure negatives (judging averages the detector's probability over the same last frames).
    verdict_frames: int = 3
    # Frames from the first part of every episode (before ``early_fraction`` of its length) taken as
    # negatives: whatever the outcome, the task was not done yet there.
    early_negatives: int = 2
    early_fraction: float = 0.6
    # Frames taken as negatives before each human takeover (RLIF: the policy was going wrong there),
    # from the ``takeover_window`` ticks before it (~0.5 s of reaction time at 30 fps).
    takeover_negatives: int = 2
    takeover_window: int = 15
    # Training: AdamW over the classifier's trainable part (the backbone stays frozen). Few epochs: at 40
    # the head overfit 50 labelled push episodes (`bench detector`: test ROC-AUC 0.97, against 0.99-1.0
    # at 15-20), and its probabilities for unseen successes fell towards 0.
    epochs: int = 15
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.01
    # Calibration: each labelled episode is scored by a head fit on the other folds (this many, stratified
    # by outcome; one per episode when fewer), and the threshold is set on those out-of-fold scores. A
    # fit costs this many head fits more than one (the backbone runs once).
    calibration_folds: int = 5
    # A verdict is "sure" when its score is at least ``margin`` from the threshold, where margin is the
    # smallest distance beyond which the out-of-fold scores were judged at least this accurately.
    sure_accuracy: float = 0.98
    min_margin: float = 0.05  # never sure closer to the threshold than this
    min_labelled: int = 6  # a task's detector is trained once it has this many labelled episodes ...
    min_per_outcome: int = 2  # ... with at least this many successes and as many failures
    retrain_every: int = 5  # then trained again after this many new labelled episodes
    seed: int = 0  # the folds, the classifier's start and the training order

    def __post_init__(self) -> None:
        if not self.cameras:
            raise ValueError("DetectorConfig: cameras must name at least one camera")
        if not self.backbone_channels:
            raise ValueError("DetectorConfig: backbone_channels must name at least one stage")
        if self.verdict_frames < 1:
            raise ValueError(f"DetectorConfig: verdict_frames must be >= 1, got {self.verdict_frames}")
        if not 0.0 < self.early_fraction <= 1.0:
            raise ValueError(f"DetectorConfig: early_fraction must be in (0, 1], got {self.early_fraction}")
        if self.calibration_folds < 2:
            raise ValueError(f"DetectorConfig: calibration_folds must be >= 2, got {self.calibration_folds}")
        if not 0.5 < self.sure_accuracy <= 1.0:
            raise ValueError(f"DetectorConfig: sure_accuracy must be in (0.5, 1], got {self.sure_accuracy}")
        if self.min_per_outcome < 1 or self.min_labelled < 2 * self.min_per_outcome:
            raise ValueError("DetectorConfig: needs min_per_outcome >= 1 and min_labelled >= 2 * min_per_outcome "
                             f"(got {self.min_per_outcome}, {self.min_labelled})")
        if self.retrain_every < 1:
            raise ValueError(f"DetectorConfig: retrain_every must be >= 1, got {self.retrain_every}")
        self.cameras = tuple(self.cameras)
        self.learn_from = tuple(self.learn_from)
        teachers = ("operator", "task")  # a detector's own verdicts never teach it (judge.py)
        if not set(self.learn_from) <= set(teachers):
            raise ValueError(f"DetectorConfig: learn_from must name sources among {teachers}, got {self.learn_from}")
        self.backbone_channels = tuple(self.backbone_channels)
        self.backbone_seeds = tuple(self.backbone_seeds)
        if not self.backbone_seeds:
            raise ValueError("DetectorConfig: backbone_seeds must name at least one seed")

    @property
    def image_size(self) -> int:
        """Side of the square frames the backbone reads (its last stage then has a 4x4 grid)."""
        return 16 * 2 ** (len(self.backbone_channels) - 1)
