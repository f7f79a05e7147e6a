"""A simulated robot judged as an unattended real arm is: by the learner's success detector.

On a real arm nothing knows whether a task succeeded: a person says so, or the learner's success
detector (``robot_rl.learner.judge``) does once it has learnt from people's verdicts. With
``run.verdicts=detector`` the main job's simulated robots are judged that way, so what it learns can
be set beside what it learns from the sim's own verdicts (``robot-rl bench detector
bench.main_job=true``):

* A robot's first ``labelled`` episodes are judged by the scripted operator, who sees the sim's
  ground truth: a success ends the episode at that tick (a person pressing "success" the moment the
  cube is there), and the verdict is the operator's (``success_source=operator``), which teaches the
  detector.
* Afterwards the ground truth ends nothing and says nothing. The episode ends on the detector's sure
  success (its guess comes back with the learner's acks, a segment or two behind the arm) or at its
  last tick. Its verdict is the detector's when the detector is sure; when it is unsure, or has no
  guess yet, the operator is asked and answers from what the scene shows at the end, as
  ``robot-rl session`` asks a person (``Episode.asked``). That answer teaches the detector too.

``Episode.success`` stays what happened in the sim (what the learning curve counts); the verdict
stored is on the episode's last step (``Episode.verdict_source``, ``Episode.verdict_success``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from robot_rl.core.types import Episode, EpisodeVerdict, VerdictSource

if TYPE_CHECKING:
    from robot_rl.edge.runtime import EdgeRuntime


@dataclass(frozen=True)
class UnattendedVerdicts:
    """How one robot's episodes are judged with ``run.verdicts=detector``."""

    labelled: int  # this robot's first episodes, judged by the operator from the sim's ground truth
    # At an episode's end, how long to wait for the acks that bring the detector's guess on its last
    # segments (``session.detector_wait_s``).
    wait_s: float

    def __post_init__(self) -> None:
        if self.labelled < 0 or self.wait_s < 0:
            raise ValueError(f"UnattendedVerdicts: labelled and wait_s must be >= 0, got {self.labelled}, "
                             f"{self.wait_s}")


def run_judged_episode(runtime: EdgeRuntime, is_success: Callable[[], bool], plan: UnattendedVerdicts,
                       max_steps: int, instruction: str, *, episode_id: int, seed: int | None) -> Episode:
    """Tick one episode of ``runtime`` (built without a task, so its steps carry no verdict), judge it
    as the module doc says, and hand it to ``runtime.finish_episode``. ``is_success``: the sim's
    ground truth, which only the operator reads."""
    labelling = episode_id < plan.labelled
    runtime.begin_episode(instruction, seed)
    episode = Episode(runtime.robot_id, episode_id, instruction, seed=seed)
    verdict: EpisodeVerdict | None = None
    with runtime.node.realtime():
        for _ in range(max_steps):
            episode.steps.append(runtime.tick())
            if labelling and is_success():
                verdict = EpisodeVerdict(True, VerdictSource.operator.value, 1.0)
                break
            guess = None if labelling else runtime.detector_guess()
            if guess is not None and guess.sure and guess.success:
                verdict = EpisodeVerdict(True, VerdictSource.detector.value, guess.confidence)
                break
    episode.success = is_success()
    if verdict is None and not labelling:
        guess = runtime.detector_guess(plan.wait_s)
        if guess is not None and guess.sure:
            verdict = EpisodeVerdict(guess.success, VerdictSource.detector.value, guess.confidence)
        else:
            episode.asked = True
    if verdict is None:  # labelled, or asked: the operator answers from what the scene shows
        verdict = EpisodeVerdict(episode.success, VerdictSource.operator.value, 1.0)
    verdict.apply(episode.steps)
    episode.steps[-1].done = True  # ``finish_episode`` keeps a done step's verdict as it is
    runtime.finish_episode(episode)
    return episode
