"""``EdgeRuntime``: one robot's edge, wired once: robot + policy + node + learner link + local recorder.

Every robot runs through it: the main job's simulated robots (``robot_rl.app.local_run``, on threads
or in robot processes), an operator's ``robot-rl session`` and an unattended ``robot-rl edge``
(``robot_rl.session``). What differs between them is who ends an episode (the task, the time, an
operator's verdict), not how its data travels:

* **Streamed while the episode runs.** The learner link (``robot_rl.edge.learner_link``) is the
  node's step sink: every ``segment_steps`` ticks a segment is queued, spooled on disk (fsync) by the
  link's thread, sent and acked. A process killed mid-episode loses only what was not spooled yet,
  at most one segment; the spool re-sends the rest after a restart, and the learner stores the
  episode as truncated once the robot has moved on to a newer one (or after its silence timeout).
* **Recorded locally when it ends.** ``finish_episode`` writes the episode into the robot's own
  LeRobotDataset v3 (``robot_rl.data.recorder``) and sends its last step, marked done with its
  verdict. The dataset is the robot's record of what it did, learner or not. A robot that goes
  straight on to its next episode (the main job's) writes it on a thread of its own at a raised
  nice value (``record_behind``): a LeRobot episode write takes seconds, which the robot spends
  acting instead.
* **Journaled while it runs.** Until the dataset has the episode, its segments are on disk in the
  recorder's journal (``robot_rl.edge.journal``, fsynced a segment at a time). A runtime that
  starts on a journal a crash left stores what it holds in the dataset first, as a truncated
  episode: a kill -9 mid-episode costs the local dataset at most one segment too.
* **A thrown-away attempt** (an operator's rerecord): ``discard_episode`` writes nothing locally;
  the learner, which has its segments already, stores it as truncated: real experience with no
  outcome claimed, never counted as a success or a failure.

The control thread never waits on inference, the network or the disk (``robot_rl.edge.node``'s
timing contract): the link only enqueues on it; spooling, sending, weight loads and swaps run on
the link's and the loader's threads (or in the policy's own process). ``finish_episode`` writes to
disk after the episode's last tick, never during one.

Weights: the link fetches what the learner publishes and the policy's swap takes it between two
chunks (``robot_rl.edge.swap``); each Step carries the version that computed it and the heartbeat
reports the newest executed one.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

import torch

from robot_rl.bridges.zmq.client import ClientConfig
from robot_rl.bridges.zmq.segments import ImageEncoding
from robot_rl.core.clock import Clock
from robot_rl.core.priority import lower_thread_priority
from robot_rl.core.types import DetectorGuess, Episode, Step
from robot_rl.data.recorder import EpisodeRecorder, RecordingError
from robot_rl.edge.config import EdgeConfig
from robot_rl.edge.inference import SelfServingPolicy
from robot_rl.edge.journal import EpisodeJournal, journal_dir
from robot_rl.edge.learner_link import EdgeStreamer
from robot_rl.edge.node import EdgeNode, EpisodeTask, Intervention

log = logging.getLogger(__name__)

RECORD_NICE = 10  # the local dataset's writer yields the CPU to the control loop, inference and the link
RECORD_QUEUE_EPISODES = 2  # episodes waiting for the writer; past it the next episode waits to start (never dropped)


def receives_weights(policy: object) -> bool:
    """True where published weights can be swapped into ``policy`` (a torch module, here or in its own process)."""
    return isinstance(policy, torch.nn.Module) or (isinstance(policy, SelfServingPolicy)
                                                   and bool(getattr(policy, "swappable", False)))


class EdgeRuntime:
    """One robot's edge (see the module doc).

    >>> runtime = EdgeRuntime(robot, policy, WallClock(), EdgeConfig(), robot_id="so101-a",
    ...                       client=client_config, recorder=EpisodeRecorder(...))
    >>> runtime.start()
    >>> episode = runtime.run_episode(300, instruction)     # streamed as it runs, then recorded
    >>> runtime.close()
    """

    def __init__(
        self,
        robot: Any,
        policy: Any,
        clock: Clock,
        edge: EdgeConfig,
        *,
        robot_id: str,
        client: ClientConfig | None = None,
        recorder: EpisodeRecorder | None = None,
        task: EpisodeTask | None = None,
        intervention: Intervention | None = None,
        segment_steps: int = 15,
        image_encoding: ImageEncoding | None = None,
        view: Any = None,
        record_behind: bool = False,
    ) -> None:
        self.robot = robot
        self.robot_id = robot_id
        self.recorder = recorder
        self.node = EdgeNode(robot, policy, clock, edge, task=task, intervention=intervention, robot_id=robot_id,
                             policy_version=client.policy_version if client is not None else 0)
        self.link: EdgeStreamer | None = None
        if client is not None:
            self.link = EdgeStreamer(client, policy if receives_weights(policy) else None,
                                     segment_steps=segment_steps, image_encoding=image_encoding)
            self.link.attach(self.node)
        self.record_errors = 0  # episodes the local dataset refused (logged; the learner still has them)
        self.journal: EpisodeJournal | None = None
        self.recovered_ticks = 0  # ticks of episodes a crash had cut, stored from the journal at this start
        if recorder is not None:
            self.journal = EpisodeJournal(journal_dir(recorder.root), robot_id, segment_steps=segment_steps,
                                          image_encoding=image_encoding)
            self._recover_unfinished()
            self._attach_journal(self.journal.start())
        self.view = view  # a live view of the node (robot_rl.edge.rerun_view), or None
        if view is not None:
            view.attach(self.node)
        self._writer: threading.Thread | None = None
        self._to_write: queue.Queue[tuple[Episode, int | None] | None] = queue.Queue(maxsize=RECORD_QUEUE_EPISODES)
        if recorder is not None and record_behind:
            self._writer = threading.Thread(target=self._write_loop, name=f"record-{robot_id}", daemon=True)
            self._writer.start()
            lower_thread_priority(self._writer, RECORD_NICE)

    # ------------------------------------------------------------ lifecycle

    def start(self, connect_timeout_s: float) -> bool:
        """Start the link and wait (at most ``connect_timeout_s``) for the learner's hello; True if it
        came. A learner that refuses this robot (config hash, key) raises ``ConnectionError``; one that
        is not there yet is no error: segments wait in the spool."""
        if self.link is None:
            return False
        self.link.start()
        if self.link.link.wait_connected(connect_timeout_s):
            return True
        config, refusal = self.link.link.config, self.link.link.refusal
        if refusal:
            self.link.stop(timeout_s=1.0)
            self.link = None
            raise ConnectionError(f"the learner at {config.router_endpoint} refused this robot: {refusal}")
        log.warning("%s: learner at %s not reachable yet; running anyway, segments wait in %s", self.robot_id,
                    config.router_endpoint, config.spool_dir)
        return False

    def close(self, ack_timeout_s: float = 30.0) -> bool:
        """Give the learner a bounded moment to ack everything, then stop; True if all was acked (the
        rest stays in the spool and goes with the next start)."""
        acked = True
        try:
            if self.link is not None:
                acked = self.link.link.flush(ack_timeout_s)
                if not acked:
                    log.warning("%s: not everything reached the learner yet; the rest waits in %s", self.robot_id,
                                self.link.link.config.spool_dir)
                self.link.stop()
        finally:
            self.node.close()
            if self.view is not None:
                self.view.close()
            if self._writer is not None:
                self._to_write.put(None)
                self._writer.join()  # every episode handed over is written before the dataset is finalized
            if self.journal is not None:
                self.journal.close()  # an episode cut short by the close stays journaled for the next start
            if self.recorder is not None:
                self.recorder.close()
        return acked

    # ------------------------------------------------------------ episodes

    def begin_episode(self, instruction: str, scene_seed: int | None = None) -> None:
        """A new episode: an empty plan, tick 0 next (the link starts a new episode id with it)."""
        self.node.reset_episode(instruction, scene_seed)

    def tick(self) -> Step:
        """One control tick; its Step is already on its way to the learner."""
        return self.node.tick()

    def run_episode(self, max_steps: int, instruction: str, *, episode_id: int = 0, seed: int | None = None
                    ) -> Episode:
        """Tick until the task ends the episode or ``max_steps``, then record it (``finish_episode``)."""
        episode = self.node.run_episode(max_steps, instruction, episode_id=episode_id, seed=seed)
        self.finish_episode(episode)
        return episode

    def finish_episode(self, episode: Episode) -> int | None:
        """The episode has its verdict (``episode.success``, on its last step too): send its last step,
        marked done, and write it to the local dataset. Returns its index there (None: no recorder,
        written behind (``record_behind``), or the dataset refused it: logged and counted, the learner
        has it anyway)."""
        last = episode.steps[-1] if episode.steps else None
        if last is not None and not last.done:  # a done step may be on the wire already: never mutated
            last.done, last.success = True, bool(episode.success)
        if self.link is not None:
            self.link.end_episode()
        journaled = self.journal.end_episode() if self.journal is not None else None
        if self.recorder is None or not episode.steps:
            return None
        if self._writer is not None:
            self._to_write.put((episode, journaled))
            return None
        return self._record(episode, journaled)

    def _record(self, episode: Episode, journaled: int | None) -> int | None:
        """Write ``episode`` to the local dataset, then drop its journal (written or refused: a restart
        would only be refused again)."""
        assert self.recorder is not None and self.journal is not None
        try:
            return self.recorder.write_episode(episode)
        except (RecordingError, OSError) as exc:
            self.record_errors += 1
            log.error("%s: episode %d not written to %s: %s", self.robot_id, episode.episode_id, self.recorder.root,
                      exc)
            return None
        finally:
            self.journal.forget(journaled)

    def _write_loop(self) -> None:
        while (job := self._to_write.get()) is not None:
            episode, journaled = job
            try:
                self._record(episode, journaled)
            except Exception:  # the writer must keep taking episodes, or the robot would wait on it
                self.record_errors += 1
                log.exception("%s: episode %d not written locally (the learner has it)", self.robot_id,
                              episode.episode_id)

    def discard_episode(self) -> None:
        """Throw the episode away: nothing is written locally (its journal is dropped); the learner
        stores what it received as truncated (no outcome) once the next episode starts."""
        if self.link is not None:
            self.link.abandon_episode()
        if self.journal is not None:
            self.journal.forget(self.journal.end_episode())

    # ------------------------------------------------------------ the journal

    def _attach_journal(self, journal: EpisodeJournal) -> None:
        """Every step the node records goes to the journal, then to the sink it had (the link's); both only enqueue."""
        previous = self.node.step_sink

        def sink(step: Step) -> None:
            journal.add(step)
            if previous is not None:
                previous(step)

        self.node.step_sink = sink

    def _recover_unfinished(self) -> None:
        """Store the episodes a crash cut short (still in the journal) in the local dataset before
        anything else is recorded: truncated, unless the verdict was journaled too. One the dataset
        refuses is moved aside in the journal's folder; a disk error leaves it for the next start."""
        assert self.recorder is not None and self.journal is not None
        for unfinished in self.journal.unfinished():
            episode = unfinished.episode
            try:
                self.recorder.write_episode(episode, finalize=True)  # finalized before its journal goes
            except RecordingError as exc:
                self.journal.set_aside(unfinished, f"the local dataset refused it: {exc}")
                log.error("%s: an episode cut short by a crash could not be stored in %s (%s); kept in %s",
                          self.robot_id, self.recorder.root, exc, self.journal.directory)
                continue
            except OSError as exc:
                log.error("%s: an episode cut short by a crash could not be stored in %s (%s); it stays in %s "
                          "for the next start", self.robot_id, self.recorder.root, exc, self.journal.directory)
                continue
            self.journal.drop(unfinished)
            self.recovered_ticks += episode.num_steps
            log.warning("%s: an episode cut short by a crash stored from the journal into %s: %d ticks, %s",
                        self.robot_id, self.recorder.root, episode.num_steps,
                        "truncated" if unfinished.truncated else f"success={episode.success}")

    # ------------------------------------------------------------ what the caller shows

    @property
    def policy_version(self) -> int:
        return self.node.policy_version

    def detector_guess(self, wait_s: float = 0.0) -> DetectorGuess | None:
        """The learner's success detector's newest guess on the running episode (None: no learner, no
        trained detector for its task, or none arrived yet). ``wait_s`` > 0: first wait (bounded) for
        the acks of what was sent, which bring the guess on all but the episode's last segment or so;
        never on the control thread while the episode runs."""
        if self.link is None:
            return None
        if wait_s > 0 and self.link.link.connected:
            self.link.link.flush(wait_s)
        return self.link.detector_guess()

    def wait_acked(self, timeout_s: float) -> bool:
        """Wait (bounded) until the learner has acked everything sent so far."""
        return self.link is not None and self.link.link.flush(timeout_s)
