"""The learner's success judge at work: judged episodes teach it, unjudged ones get its verdict.

Every stored robot episode passes here on its way to the dataset (``ReplayStore``):

* **As steps arrive** each segment's frames of the detector's cameras are resized to the
  detector's input (``DetectorConfig.image_size``, 64x64 by default: 25 kB a step for two cameras)
  on the store's decode threads, beside the policy's own resize; the index keeps frames at the
  policy's size, which need not be the detector's.
* **While the episode runs** each staged segment of an episode whose task has a trained detector
  asks for a guess on the episode so far (its first frame and its newest ones, as ``TaskDetector``
  judges a whole episode): the ``store-judge`` thread makes it, at most one waiting per episode, and
  ``guess`` hands the newest to the serving thread, whose next ack to that robot carries it. The
  robot may end the episode on a sure success (``robot_rl.session``) and asks its operator only
  when the detector is unsure. Acks never wait for a guess: one covers the segments acked before.
* **When the episode closes** (``finish``, on the thread that acks robots: it only queues) the
  ``store-judge`` thread assembles its frames in seq order. An episode an operator or the task
  judged goes to ``SuccessJudge.learn`` on the ``judge-fit`` thread (a fit takes seconds to a
  minute; judging and storing never wait for it). An episode nobody judged gets its task's
  detector's verdict (``success_source=detector``, with its confidence), or keeps none while the
  task has no trained detector.
* **Before it is written** the commit thread takes that verdict (``verdict``) and puts it on the
  episode's last step, in the dataset and in the sampling index.

A task is named by an episode's instruction (``task_of``: a sim instruction by its family), the only
name of what was attempted that travels with its steps. An episode whose frames are not all here
(its first segments were staged before a restart, and read back by recovery, not by the decode
threads) is neither judged nor learnt from.

An operator's verdict always wins: it is on the episode's last step, which has arrived before the
episode closes, and the detector judges only an episode that carries no verdict at all.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from robot_rl.core.types import UNJUDGED, DetectorGuess, EpisodeVerdict, Step, VerdictSource
from robot_rl.learner.detector_config import DetectorConfig
from robot_rl.learner.detector_episodes import Calibration, LabelledEpisode, resize
from robot_rl.learner.family_balance import OTHER_FAMILY, family_of
from robot_rl.learner.index import EntryKey
from robot_rl.learner.judge import MAX_LABELLED, SuccessJudge
from robot_rl.learner.labelled_files import LabelledEpisodeFiles

log = logging.getLogger(__name__)

JUDGE_WAIT_S = 60.0  # the commit thread's bound on waiting for one verdict (judging takes milliseconds)


def task_of(instruction: str) -> str:
    """The task whose detector judges an episode with this instruction. A sim instruction names its task
    family: the sim words each family's instructions with a cube colour and, for push, a direction,
    details of one task a detector learns to judge from the scene, not the words (one detector per
    instruction would spread 50 labelled push episodes over six detectors, few of them with a failure
    to learn from). Any other instruction is a task of its own: a real arm's tasks are what its
    operators ask for."""
    family = family_of(instruction)
    return instruction if family == OTHER_FAMILY else family


@dataclass(frozen=True)
class Piece:
    """One segment's share of what the judge reads: its frames at the detector's size, its takeovers,
    and its last step's verdict (the episode's, when this is its last segment)."""

    frames: dict[str, np.ndarray]  # camera -> uint8 [N, S, S, 3]
    is_intervention: np.ndarray  # bool [N]
    task: str  # ``task_of`` its instruction
    verdict: EpisodeVerdict


@dataclass
class _Collected:
    pieces: dict[int, Piece] = field(default_factory=dict)  # by seq


class EpisodeJudging:
    """Feeds one ``SuccessJudge`` from the replay store (see the module doc). ``background``: judge on
    the ``store-judge`` thread, else inline in ``finish`` (tools, tests); fits always run on ``judge-fit``."""

    def __init__(self, judge: SuccessJudge, *, background: bool = True) -> None:
        self.judge = judge
        self.cameras = tuple(judge.config.cameras)
        self._lock = threading.Lock()
        self._open: dict[EntryKey, _Collected] = {}
        self._verdicts: dict[EntryKey, Future[EpisodeVerdict | None]] = {}
        self._judging = ThreadPoolExecutor(1, thread_name_prefix="store-judge") if background else None
        self._fitting = ThreadPoolExecutor(1, thread_name_prefix="judge-fit")
        self._fits: list[Future[Calibration | None]] = []
        self._said_missing = False
        self._guessing: set[EntryKey] = set()  # open episodes with a guess waiting for the judge thread
        self._guesses: dict[str, DetectorGuess] = {}  # robot -> the newest guess on its open episode
        self._said_guess_failed = False
        if judge.files is not None:  # a restart: the detectors start from the verdicts learnt before it
            self._fits.append(self._fitting.submit(self._restore))

    def piece(self, steps: Sequence[Step]) -> Piece | None:
        """What the judge keeps of one decoded segment (its cameras' frames resized): decode threads.
        None when the segment lacks one of the detector's cameras (such an episode is never judged)."""
        missing = [cam for cam in self.cameras if steps and cam not in steps[0].images]
        if not steps or missing:
            if missing and not self._said_missing:
                self._said_missing = True
                log.warning("success detector: the robots record no camera %s (learner.detector.cameras): no episode "
                            "is judged or learnt from", missing)
            return None
        size = self.judge.config.image_size
        frames = {cam: resize(np.stack([s.images[cam] for s in steps]), size) for cam in self.cameras}
        return Piece(frames, np.array([s.is_intervention for s in steps], dtype=bool), task_of(steps[0].instruction),
                     EpisodeVerdict.of(list(steps)))

    def add(self, key: EntryKey, seq: int, piece: Piece | None) -> None:
        """A staged segment's piece (ingest, under the store's lock: a dict insert, and a guess on the
        episode so far queued for the judge thread when its task has a detector)."""
        if piece is None:
            return
        with self._lock:
            collected = self._open.setdefault(key, _Collected())
            collected.pieces[seq] = piece
            # A later piece of an episode lacks its first frames; one guess waiting reads the newest pieces.
            if key[2] != 0 or 0 not in collected.pieces or key in self._guessing:
                return
            if self.judge.detector(piece.task) is None:
                return
            self._guessing.add(key)
        if self._judging is not None:
            self._judging.submit(self._guess, key)
        else:
            self._guess(key)

    def guess(self, robot_id: str, episode_id: int) -> DetectorGuess | None:
        """The newest guess on episode ``episode_id`` of ``robot_id`` while it is open (serving thread)."""
        with self._lock:
            guess = self._guesses.get(robot_id)
        return guess if guess is not None and guess.episode_id == episode_id else None

    def finish(self, key: EntryKey, seqs: Iterable[int]) -> None:
        """Episode ``key`` is closed with segments ``seqs``: judge it (queued when in the background)."""
        with self._lock:
            collected = self._open.pop(key, None)
            said = self._guesses.get(key[0])
            if said is not None and said.episode_id == key[1]:
                del self._guesses[key[0]]
        if key[2] != 0:  # a later piece of an episode (its robot went silent, then sent the rest): it lacks the
            return  # first frames the detector compares with, and its first piece was judged on its own
        pieces = None if collected is None else [collected.pieces.get(seq) for seq in sorted(seqs)]
        if not pieces or any(p is None for p in pieces):
            return  # frames missing (staged before a restart): no verdict, nothing learnt
        whole = [p for p in pieces if p is not None]
        future: Future[EpisodeVerdict | None]
        if self._judging is not None:
            future = self._judging.submit(self._judge, key, whole)
        else:
            future = Future()
            try:
                future.set_result(self._judge(key, whole))
            except Exception as exc:  # noqa: BLE001 - reported by verdict(), as on the thread
                future.set_exception(exc)
        with self._lock:
            self._verdicts[key] = future

    def verdict(self, key: EntryKey, timeout_s: float = JUDGE_WAIT_S) -> EpisodeVerdict | None:
        """The detector's verdict on episode ``key``, for the commit thread; None when it carries its own
        verdict, or its task has no detector yet, or judging failed (logged: the episode is stored unjudged)."""
        with self._lock:
            future = self._verdicts.pop(key, None)
        if future is None:
            return None
        try:
            return future.result(timeout=timeout_s)
        except Exception:
            log.exception("success detector: robot %s episode %d could not be judged; stored without a verdict",
                          key[0], key[1])
            return None

    def wait_fits(self, timeout_s: float = 600.0) -> None:
        """Until every judged episode handed over so far is learnt (tools, tests)."""
        if self._judging is not None:
            self._judging.submit(lambda: None).result(timeout=timeout_s)
        for fit in list(self._fits):
            fit.result(timeout=timeout_s)

    def calibrations(self) -> dict[str, Calibration]:
        return self.judge.calibrations()

    def close(self) -> None:
        if self._judging is not None:
            self._judging.shutdown(wait=True, cancel_futures=True)
        self._fitting.shutdown(wait=True, cancel_futures=True)

    def _judge(self, key: EntryKey, pieces: list[Piece]) -> EpisodeVerdict | None:
        said = pieces[-1].verdict
        task = pieces[0].task
        frames = {cam: np.concatenate([p.frames[cam] for p in pieces]) for cam in self.cameras}
        if said.source in (VerdictSource.operator, VerdictSource.task):
            if said.source not in self.judge.config.learn_from:
                return None
            flags = np.concatenate([p.is_intervention for p in pieces])
            labelled = LabelledEpisode(task, frames, said.success, flags)
            self._fits = [f for f in self._fits if not f.done()]
            self._fits.append(self._fitting.submit(self._learn, labelled, VerdictSource(said.source)))
            return None
        if said.source != UNJUDGED:
            return None  # a detector's verdict already (a replayed store): it stays as it is
        verdict = self.judge.judge(task, frames)
        if verdict is None:
            return None
        log.info("success detector: robot %s episode %d (%r) judged a %s, confidence %.2f%s", key[0], key[1], task,
                 "success" if verdict.success else "failure", verdict.confidence, "" if verdict.sure else " (unsure)")
        return EpisodeVerdict(bool(verdict.success), VerdictSource.detector.value, float(verdict.confidence))

    def _guess(self, key: EntryKey) -> None:
        """The detector on open episode ``key`` so far: its first frame and its newest ``verdict_frames``."""
        with self._lock:
            self._guessing.discard(key)
            collected = self._open.get(key)
            if collected is None:
                return  # closed meanwhile: its verdict is finish's business
            first = collected.pieces[0]
            newest: list[Piece] = []
            for seq in sorted(collected.pieces, reverse=True):
                newest.insert(0, collected.pieces[seq])
                if sum(len(p.is_intervention) for p in newest) >= self.judge.config.verdict_frames:
                    break
        frames = {cam: np.concatenate([first.frames[cam][:1], *(p.frames[cam] for p in newest)])
                  for cam in self.cameras}
        try:
            verdict = self.judge.judge(first.task, frames)
        except Exception:
            if not self._said_guess_failed:  # said once: the close-time verdict reports its own failures
                self._said_guess_failed = True
                log.exception("success detector: a guess on robot %s's running episode failed; its acks carry none",
                              key[0])
            return
        if verdict is None:
            return
        with self._lock:
            if key in self._open:
                self._guesses[key[0]] = DetectorGuess(key[1], bool(verdict.success), float(verdict.confidence),
                                                      bool(verdict.sure))

    def _restore(self) -> None:
        try:
            self.judge.restore()
        except Exception:
            log.exception("success detector: the labelled episodes kept before a restart could not be taken back; "
                          "the detectors learn from new verdicts only")

    def _learn(self, episode: LabelledEpisode, source: VerdictSource) -> Calibration | None:
        try:
            return self.judge.learn(episode, source)
        except Exception:
            log.exception("success detector: learning from an episode of %r failed; it is left out", episode.task)
            return None



def make_judging(config: DetectorConfig, *, background: bool, keep_in: Path | None = None) -> EpisodeJudging | None:
    """The learner's judge per ``learner.detector`` (None when it is off). ``keep_in``: the folder its labelled
    episodes are kept in across restarts (``LabelledEpisodeFiles``); None keeps them in memory only."""
    if not config.enabled:
        return None
    judge = SuccessJudge(config, MAX_LABELLED, LabelledEpisodeFiles(keep_in, config, MAX_LABELLED) if keep_in else None)
    return EpisodeJudging(judge, background=background)

