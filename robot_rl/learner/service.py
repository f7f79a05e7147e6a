"""The learner service: the wire server, the replay store and the trainer, running together.

Threads: one serves the sockets (hello, segments -> store -> ack in batches with one
fsync each, heartbeats, weight chunks), two decode images for it, one trains (``Trainer``),
one writes finished episodes to the dataset (inside ``ReplayStore``). The serving thread
never waits for training, so robots are acked as fast as their segments reach the disk.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from robot_rl.bridges.zmq.keys import ServerCurve
from robot_rl.bridges.zmq.protocol import Ack, Error, Heartbeat, Hello, Segment, guess_document
from robot_rl.bridges.zmq.server import Peer, ServerConfig, ServerHandlers, ZmqServer
from robot_rl.bridges.zmq.weights import WeightsBlob
from robot_rl.core.errors import ConfigError
from robot_rl.core.layout import RecordedLayout
from robot_rl.learner.config import LearnerConfig, ServiceConfig
from robot_rl.learner.console import FleetConsole
from robot_rl.learner.ddp import DistContext, DistributedTrainer
from robot_rl.learner.fleet import RobotStatus, status_line, stored_episodes
from robot_rl.learner.hub import HubPusher, dataset_snapshot
from robot_rl.learner.judging import make_judging
from robot_rl.learner.labelled_files import JUDGED_FOLDER
from robot_rl.learner.metrics import make_logger
from robot_rl.learner.published import PublishedHistory, PublishedVersion
from robot_rl.learner.store import ReplayStore
from robot_rl.learner.trainer import Trainer
from robot_rl.policies.trainable import TrainablePolicy

log = logging.getLogger(__name__)

# Robots that said hello and went away are remembered (for the status line) up to this many; beyond
# it the longest gone are forgotten. Without CURVE any client may say hello under any id, and a
# learner that remembers them all grows its memory and every status line with each one.
REMEMBERED_GONE_ROBOTS = 64


def server_config(service: ServiceConfig, config_hash: str) -> ServerConfig:
    curve = None
    if service.secret_key or service.robot_keys_dir:
        if not (service.secret_key and service.robot_keys_dir):
            raise ValueError("CURVE needs both service.secret_key (learner NAME.key_secret) and "
                             "service.robot_keys_dir (the robots' *.key files); generate them with `robot-rl keys`")
        curve = ServerCurve.from_files(service.secret_key, service.robot_keys_dir)
    return ServerConfig(router_endpoint=service.router_endpoint, pub_endpoint=service.pub_endpoint,
                        server_id=service.server_id, config_hash=config_hash, curve=curve,
                        allow_insecure=service.allow_insecure, heartbeat_interval_s=service.heartbeat_interval_s,
                        peer_timeout_s=service.peer_timeout_s, keep_weight_versions=service.keep_weight_versions,
                        peer_limits=service.peer_limits)


def check_layout(config: LearnerConfig, policy: TrainablePolicy) -> None:
    """What ``learner.store`` pins must hold what the policy reads, or training would fail much
    later (what it leaves open is checked at each robot's hello)."""
    store = config.store
    missing = [c for c in policy.cameras if store.cameras is not None and c not in store.cameras]
    joints = len(store.joint_names) if store.joint_names is not None else policy.state_dim
    if missing or joints != policy.state_dim or policy.state_dim != policy.action_dim:
        raise ValueError(f"learner.store records cameras {store.cameras} and {joints} joints, "
                         f"but the policy reads cameras {list(policy.cameras)} with state_dim {policy.state_dim} / "
                         f"action_dim {policy.action_dim}; make learner.store match the policy config")


class LearnerService(ServerHandlers):
    """``with LearnerService(config, policy) as learner: learner.start(); ...``"""

    def __init__(self, config: LearnerConfig, policy: TrainablePolicy, *, resume: bool = False, train: bool = True,
                 dist: DistContext | None = None) -> None:
        """``dist``: this is rank 0 of a data-parallel job (``robot_rl.learner.ddp``); None: one process."""
        if dist is not None and not train:
            raise ValueError("--no-train under torchrun leaves the other ranks idle; start a single process instead")
        self.config = config
        self.robots: dict[str, RobotStatus] = {}
        check_layout(config, policy)
        self.state_dim = policy.state_dim
        self.store = ReplayStore(config.store, train_cameras=policy.cameras, input_frames=policy.input_frames,
                                 judging=make_judging(config.detector, background=config.store.background_commit,
                                                     keep_in=Path(config.store.root) / JUDGED_FOLDER))
        self.policy = policy
        try:
            known = self.store.layout.joint_names if self.store.layout is not None else config.store.joint_names
            if known is not None:
                policy.bind_joints(known)
            self.server = ZmqServer(server_config(config.service, policy.config_hash()), handlers=self)
            self.logger = make_logger(config, self.store.outcomes) if train else None
            self.hub = HubPusher(config.hub, dataset_snapshot(self.store)) if config.hub.enabled else None
            on_checkpoint = self.hub.notify_checkpoint if self.hub is not None else None
            if dist is None:
                self.trainer = Trainer(policy, self.store.index, config.trainer, config.algorithm,
                                       publish=self._publish, logger=self.logger, on_checkpoint=on_checkpoint)
            else:
                self.trainer = DistributedTrainer(policy, self.store.index, config.trainer, config.algorithm, dist,
                                                  publish=self._publish, logger=self.logger,
                                                  on_checkpoint=on_checkpoint)
            if resume:
                self.trainer.resume()
        except BaseException:
            self.store.close()
            raise
        self._train = train
        self.published = PublishedHistory(config.trainer.checkpoint_dir, self.trainer.version if resume else None)
        # Called with each published version, trainer lock held (the policy server takes it in place).
        self.publish_listeners: list[Callable[[WeightsBlob], None]] = []
        # The held-out scores of published versions, if something computes them (the main job's
        # scorer): dicts with version, episodes, success, ci95, scenes. For the fleet console.
        self.heldout_points: Callable[[], list[dict[str, Any]]] = list
        self.console: FleetConsole | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_status_s = time.monotonic()
        self._writer_behind = 0  # episodes waiting for the dataset writer at the last status line

    @property
    def router_endpoint(self) -> str:
        return self.server.router_endpoint

    @property
    def pub_endpoint(self) -> str:
        return self.server.pub_endpoint

    # ------------------------------------------------------------ lifecycle

    @property
    def training(self) -> bool:
        """This service trains (False: ``--no-train``, a store and weights server only)."""
        return self._train

    def start(self) -> LearnerService:
        """Publish the current weights, then serve (and train) on background threads, and the fleet
        console (``console.url``) if ``learner.console.enabled``."""
        if self.config.console.enabled:
            self.console = FleetConsole(self, self.config.console)  # a bad host or token file: fail first
        self.trainer.publish_now()
        self._thread = threading.Thread(target=self._serve, name="learner-serve", daemon=True)
        self._thread.start()
        if self._train:
            self.trainer.start()
        if self.hub is not None:
            self.hub.start()
        if self.console is not None:
            self.console.start()
        log.info("learner serving on %s (weights on %s)", self.router_endpoint, self.pub_endpoint)
        return self

    # ------------------------------------------------------------ what the fleet console reads and does

    def _publish(self, blob: WeightsBlob) -> None:
        """The trainer's publish: remembered for the console, then served and announced."""
        self.published.append(PublishedVersion(blob.version, self.trainer.step,
                                               time.time(), len(blob)))
        self.server.publish_weights(blob)
        for listener in self.publish_listeners:
            listener(blob)

    def servable_versions(self) -> list[int]:
        return self.server.served_versions()

    def pin(self, version: int | None, robot_id: str | None = None) -> None:
        """``robot_id`` (None: the whole fleet) runs ``version`` from its next chunk on (None: the newest
        again); ValueError when that version is no longer served (``ZmqServer.pin``)."""
        if robot_id is not None and robot_id not in self.robots:
            raise ValueError(f"no robot {robot_id!r} has said hello to this learner (robots: {sorted(self.robots)})")
        self.server.pin(version, robot_id)

    def pinned_version(self, robot_id: str) -> int | None:
        return self.server.pinned_version(robot_id)

    @property
    def fleet_pin(self) -> int | None:
        return self.server.pinned_version()

    def stop(self, checkpoint: bool = True) -> None:
        """Stop training and serving; write a final checkpoint; staged data stays for the next start."""
        if self.console is not None:
            self.console.stop()
        self.trainer.stop()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10.0)
        self.store.close_left_behind()  # no segment arrives any more: a late fragment waits for nothing
        self.store.flush_index(30.0)  # the final checkpoint's index manifest covers every acked segment
        if checkpoint and self.trainer.step > 0:
            self.trainer.checkpoint()
        self.server.close()
        if self.hub is not None:
            self.hub.stop(final_push=checkpoint)  # before the store closes: it may snapshot it
        self.store.close()
        if self.logger is not None:
            self.logger.close()  # after the store: the last committed episodes are logged too

    def __enter__(self) -> LearnerService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(checkpoint=False)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                self.server.serve_once(50)
                self.store.close_stale()
                self._log_status()
            except Exception:  # the server already survives bad messages; this is the last guard
                log.exception("learner serving loop error; continuing")

    def _log_status(self) -> None:
        now = time.monotonic()
        if now - self._last_status_s < self.config.service.status_every_s:
            return
        self._last_status_s = now
        self._forget_written()
        stats = self.store.stats()
        log.info("%s", status_line(self, stats))
        if self.trainer.failure is not None:
            log.error("TRAINING STOPPED (%s): robots are still recorded, but no new weights are published; "
                      "fix the cause and restart the learner with --resume", self.trainer.failure)
        waiting = stats["episodes_to_write"]
        # More than two batches waiting and more than at the last status: ingest outpaces the writer.
        if waiting > max(self._writer_behind, 2 * self.config.store.commit_batch):
            log.warning("the dataset writer is %d episodes behind the robots (was %d): they are acked, staged and "
                        "already sampled by training, none is lost, but the dataset on disk lags; fewer robots, "
                        "cameras or fps per learner, or store.commit_batch up, let it catch up", waiting,
                        self._writer_behind)
        self._writer_behind = waiting

    def _forget_written(self) -> None:
        """Drop from each robot's ``acked_unwritten`` the episodes now in the dataset (serving thread)."""
        stored = stored_episodes(self.store.outcomes.outcomes())
        for status in list(self.robots.values()):
            status.acked_unwritten -= stored.get(status.robot_id, set())

    # ------------------------------------------------------------ wire handlers (serving thread)

    def on_hello(self, peer: Peer, msg: Hello) -> Error | None:
        refusal = self._layout_refusal(msg)
        if refusal is not None:
            log.error("robot %s refused: %s", msg.robot_id, refusal)
            return Error(code="config_mismatch", in_reply_to=msg.TYPE, message=refusal)
        status = self.robots.get(msg.robot_id) or RobotStatus(msg.robot_id, msg.policy_version)
        status.policy_version, status.connected, status.last_seen_s = msg.policy_version, True, time.monotonic()
        self.robots[msg.robot_id] = status
        return None

    def _layout_refusal(self, msg: Hello) -> str | None:
        """Why a robot may not stream here (its joints, cameras or image sizes), or None."""
        if not msg.features:
            if self.store.layout is None:
                return "the hello does not say what the robot records (features), and this store has no layout yet"
            return None  # a client that leaves it to the segments' own checks
        try:
            offered = RecordedLayout.from_document(msg.features)
        except ValueError as exc:
            return str(exc)
        if len(offered.joint_names) != self.state_dim:
            return (f"the learner's policy drives {self.state_dim} joints, this robot has "
                    f"{len(offered.joint_names)} {list(offered.joint_names)}")
        try:  # before the store adopts a layout the policy could never read
            self.policy.bind_joints(offered.joint_names)  # the store's order: what every batch is in
        except ConfigError as exc:
            return str(exc)
        refusal = self.store.adopt_layout(offered)
        if refusal is not None and self.store.layout is not None:
            self.policy.bind_joints(self.store.layout.joint_names)  # the stored order stays the policy's
        return refusal

    def on_segment(self, peer: Peer, msg: Segment) -> Ack | Error:
        reply = self.on_segments([(peer, msg)])[0]
        if isinstance(reply, Exception):
            raise reply  # ProtocolError -> the server replies with a clear error
        return reply

    def on_segments(self, items: list[tuple[Peer, Segment]]) -> list[Ack | Error | Exception]:
        """A batch from the wire: stored with one fsync (group commit), then acked together."""
        results = self.store.ingest_many([msg for _, msg in items])
        replies: list[Ack | Error | Exception] = []
        for (peer, msg), result in zip(items, results, strict=True):
            if isinstance(result, Exception):
                replies.append(result)
                continue
            status = self.robots.get(peer.robot_id)
            if status is not None and not result.duplicate:
                status.segments += 1
                status.steps += result.num_steps
                if msg.episode_done:
                    status.acked_unwritten.add(msg.episode_id)
            judging = self.store.judging  # its guess on the episode so far rides on the ack (judged off this thread)
            guess = judging.guess(msg.robot_id, msg.episode_id) if judging is not None else None
            replies.append(Ack(robot_id=msg.robot_id, episode_id=msg.episode_id, seq=msg.seq,
                               duplicate=result.duplicate, verdict=guess_document(guess)))
        return replies

    def on_heartbeat(self, peer: Peer, msg: Heartbeat) -> None:
        status = self.robots.get(peer.robot_id)
        if status is not None:
            status.policy_version, status.last_seen_s, status.connected = msg.policy_version, time.monotonic(), True
            status.stats = dict(msg.stats)

    def on_peer_lost(self, peer: Peer) -> None:
        status = self.robots.get(peer.robot_id)
        if status is not None:
            status.connected = False
        gone = sorted((r for r in self.robots.values() if not r.connected), key=lambda r: r.last_seen_s)
        for status in gone[:max(0, len(gone) - REMEMBERED_GONE_ROBOTS)]:
            del self.robots[status.robot_id]
