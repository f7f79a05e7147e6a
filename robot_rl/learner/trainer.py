"""The trainer loop: sample mixed batches, update, publish weights, checkpoint.

It runs on its own thread next to ingest and never waits for robots: when the
store holds too little data it idles briefly and looks again; otherwise it trains on
whatever the index holds at that moment. Everything that decides the next update
(weights, optimiser, step, algorithm and sampling RNG, and the index content, which
is rebuilt from disk in a canonical order) is saved by ``checkpoint``, so
``resume`` continues exactly where an uninterrupted run would be. The next batch is drawn
while an update runs (``robot_rl.learner.prefetch``), and the checkpoint records the sampler's
state from before it.

With ``ema_decay`` the robots get, and checkpoints hold as their model, the moving average
of the weights (``deployed``); the training weights travel in the checkpoint's state.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from robot_rl.bridges.zmq.weights import SnapshotBuffers
from robot_rl.core.priority import lower_own_priority
from robot_rl.learner import checkpoint as ckpt
from robot_rl.learner.algorithms.base import Algorithm, NonFiniteUpdateError
from robot_rl.learner.algorithms.config import ALGORITHMS
from robot_rl.learner.averaging import WeightAverage
from robot_rl.learner.checkpoint_pointer import latest_checkpoint
from robot_rl.learner.config import TrainerConfig
from robot_rl.learner.family_balance import FamilyBalancedSampler, FamilyTally
from robot_rl.learner.index import SampleSpec, SamplingIndex
from robot_rl.learner.metrics import LearningLogger
from robot_rl.learner.prefetch import BatchPrefetcher
from robot_rl.learner.publisher import PublishFn, PublishSchedule, snapshot
from robot_rl.policies.trainable import TrainablePolicy
from robot_rl.policies.training import auto_device

log = logging.getLogger(__name__)

TRAINING_WEIGHTS = "training_policy"  # checkpoint state entry of the training weights when the model is their average


def training_device(config: TrainerConfig) -> torch.device:
    """The device the learner trains on. On CUDA this also sets the process's float32 matmul
    precision (``config.matmul_precision``): a process-wide switch, set here because the learner
    owns its process; the CPU keeps full float32, so CPU runs stay exactly reproducible."""
    device = auto_device() if config.device == "auto" else torch.device(config.device)
    if device.type == "cuda":
        torch.set_float32_matmul_precision(config.matmul_precision)
    return device


class Trainer:
    """Owns the policy being trained; ``start()`` runs it on a thread, ``update_once()`` steps it by hand.

    ``algorithm_config`` (``LearnerConfig.algorithm``: an ``RWRConfig``, ...) chooses and configures
    the algorithm that makes each update.
    """

    def __init__(
        self,
        policy: TrainablePolicy,
        index: SamplingIndex,
        config: TrainerConfig,
        algorithm_config: object,
        publish: PublishFn | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_checkpoint: Callable[[Path], None] | None = None,
        logger: LearningLogger | None = None,
    ) -> None:
        self.config = config
        self.index = index
        self.device = training_device(config)
        self.policy = policy.to(self.device).train()
        self.algorithm_config = algorithm_config
        self.algorithm: Algorithm[object] = ALGORITHMS.build(algorithm_config, self.policy, config, self.device)
        self.average = WeightAverage(self.policy, config.ema_decay) if config.ema_decay is not None else None
        self.rng = np.random.default_rng(config.seed)
        self.step = 0
        self.version = 0  # the initial weights are version 0
        self.algorithm.set_policy_version(self.version)
        self.last_metrics: dict[str, float] = {}
        self.nonfinite_batches = 0  # skipped, over the run
        self._nonfinite_in_a_row = 0
        self.failure: str | None = None  # why the training thread stopped before it was told to
        self._publish = publish
        self._snapshot_buffers = SnapshotBuffers()  # a published version's buffer is the next one's once dropped
        self._on_checkpoint = on_checkpoint  # e.g. the Hub pusher; must return at once
        self.logger = logger  # learning curves (TensorBoard); None: not logged
        self._schedule = PublishSchedule(config.publish_every_updates, config.publish_every_s, clock)
        offsets = policy.state_offsets
        self._spec = SampleSpec(policy.training_horizon, policy.cameras, offsets.max_offset, offsets.weights,
                                config.rewards, policy.observation_history)
        sampler = FamilyBalancedSampler(index, config.family_balance)
        self.family_samples = FamilyTally()  # each task family's share of what was trained on
        # The next batch is drawn (frames read back, pinned on CUDA) while an update runs.
        self._prefetch = BatchPrefetcher(
            lambda rng: sampler.sample(config.batch_size, config.stream_ratios, self._spec, rng), self.rng,
            pin=self.device.type == "cuda")
        self._lock = threading.Lock()  # one update / checkpoint / publish at a time
        self._said_unused_streams = False  # ready(): said once why stored steps do not count
        self._stop = threading.Event()
        self._paused = threading.Event()  # set_paused(True): no updates (robots are still recorded)
        self._resumed_manifest: list[list] | None = None  # checked against the index when training starts
        self._thread: threading.Thread | None = None
        self._last_log_s = 0.0
        self._threads_wanted: int | None = None  # set_threads(): applied by the training thread itself

    @property
    def deployed(self) -> TrainablePolicy:
        """The weights robots get and checkpoints hold: the moving average, else the training weights."""
        return self.average.module if self.average is not None else self.policy

    # ------------------------------------------------------------ one update

    def ready(self) -> bool:
        """Enough steps in the streams the batches draw from (a positive ratio): a learner that
        imitates only corrections and demonstrations waits for them, whatever the robots send."""
        ratios = self.config.stream_ratios
        counts = self.index.counts()
        usable = sum(n for stream, n in counts.items() if ratios.get(stream, 0.0) > 0)
        needed = max(1, self.config.min_steps_to_train)
        if usable < needed <= sum(counts.values()) and not self._said_unused_streams:
            self._said_unused_streams = True
            log.info("not training yet: %d stored steps, but only %d in the streams this learner samples "
                     "(ratios %s; needs %d). With online_ratio 0 (hgdagger) it waits for corrections "
                     "or demonstrations.", sum(counts.values()), usable, ratios, needed)
        return usable >= needed

    @property
    def paused(self) -> bool:
        return self._paused.is_set()

    def set_paused(self, paused: bool) -> None:
        """Paused: no more updates (the one under way finishes) until unpaused; robots keep being
        recorded and served the weights they have (the fleet console's control)."""
        if paused != self._paused.is_set():
            log.info("training %s at update %d", "paused" if paused else "resumed", self.step)
        if paused:
            self._paused.set()
        else:
            self._paused.clear()

    def update_once(self) -> dict[str, float] | None:
        """One update if the store holds enough data and training is not paused (None otherwise);
        publishes/checkpoints on schedule."""
        if self.paused or not self.ready():
            return None
        with self._lock:
            return self._apply_locked(self._sample_locked())

    def _sample_locked(self) -> dict:
        """The next batch from the index (fits the normaliser first on a fresh policy)."""
        if self.policy.needs_statistics():
            self.policy.fit_statistics(*self.index.states_and_actions(), self.index.instructions())
            log.info("normalisation statistics fitted on %d stored steps", sum(self.index.counts().values()))
        return self._prefetch.next()

    def _apply_locked(self, batch: dict) -> dict[str, float]:
        """One update on ``batch``, then publish / checkpoint on schedule (the data-parallel trainer reuses it).
        A skipped batch (non-finite loss) returns ``{"skipped_nonfinite": 1.0}`` and counts no update."""
        metrics = self.update_or_skip(batch)
        if metrics is None:
            return {"skipped_nonfinite": 1.0}
        metrics = {**metrics, **self.family_samples.add(batch["instruction"])}
        if self.average is not None:
            self.average.update(self.policy)
        self.step += 1
        self.last_metrics = metrics
        if self.logger is not None:
            self.logger.log_update(self.step, metrics, self.version)
        if self._schedule.note_update():
            self._publish_locked()
        if self.step % self.config.checkpoint_every_updates == 0:
            self._checkpoint_locked()
        return metrics

    def update_or_skip(self, batch: dict) -> dict[str, float] | None:
        """The algorithm's update, or None when the batch's loss or gradient was not finite (the
        weights are untouched). ``config.max_nonfinite_batches`` such batches in a row raise: a
        learner that only skips would look alive while it never trains again."""
        try:
            metrics = self.algorithm.update(batch)
        except NonFiniteUpdateError as exc:
            self.nonfinite_batches += 1
            self._nonfinite_in_a_row += 1
            if self._nonfinite_in_a_row >= self.config.max_nonfinite_batches:
                raise RuntimeError(f"{self._nonfinite_in_a_row} batches in a row had a non-finite loss or gradient "
                                   f"(last: {exc}); training stopped at update {self.step}") from exc
            log.warning("update %d: skipped a batch with a non-finite loss or gradient (%s); %d skipped so far",
                        self.step, exc, self.nonfinite_batches)
            return None
        self._nonfinite_in_a_row = 0
        return metrics

    def publish_now(self) -> None:
        """Publish the current weights under the current version (e.g. at service start)."""
        with self._lock:
            if self._publish is not None:
                # NaN initial weights: the service fails
                self._publish(snapshot(self.deployed, self.version, self.policy.config_hash(),
                                       self.config.transfer_dtype, self._snapshot_buffers))
                self._schedule.published()

    def _publish_locked(self) -> None:
        self._schedule.published()
        if self._publish is None:
            return
        # NaN/inf weights raise NonFiniteWeightsError: nothing is published, and training stops (they never heal).
        blob = snapshot(self.deployed, self.version + 1, self.policy.config_hash(), self.config.transfer_dtype,
                        self._snapshot_buffers)
        self.version += 1
        self._publish(blob)
        self.algorithm.set_policy_version(self.version)  # staleness is measured against the newest weights
        log.info("published weights v%d at update %d", self.version, self.step)

    # ------------------------------------------------------------ thread

    def start(self) -> Trainer:
        self._thread = threading.Thread(target=self._run, name="trainer", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.error("trainer thread did not stop within %.0f s", timeout_s)
                return
        with self._lock:
            self._prefetch.discard()  # nothing reads frames for a batch no one will train on

    def set_threads(self, threads: int) -> None:
        """PyTorch intra-op threads for the training thread from its next update on (e.g. all cores
        once the robots that shared them have stopped). The training thread applies it itself:
        ``torch.set_num_threads`` from another thread leaves a running thread's count alone."""
        if threads < 1:
            raise ValueError(f"Trainer.set_threads: threads must be >= 1, got {threads}")
        self._threads_wanted = int(threads)

    def wait(self, timeout_s: float) -> bool:
        """Wait for the training thread to end by itself (``max_updates`` reached); True if it has."""
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        limit = self.config.max_updates
        lower_own_priority(self.config.thread_nice)  # before the first torch op starts its worker threads
        try:
            if self._resumed_manifest is not None:
                self._check_manifest(self._resumed_manifest)  # waits for the index to be read, as batches do
                self._resumed_manifest = None
            while not self._stop.is_set() and (limit is None or self.step < limit):
                if self._threads_wanted is not None:
                    torch.set_num_threads(self._threads_wanted)
                    self._threads_wanted = None
                if self.update_once() is None:
                    self._stop.wait(0.1)  # not enough data yet: look again soon, never block ingest
                    continue
                self._log_progress()
        except Exception as exc:
            self.failure = f"{type(exc).__name__}: {exc}"
            log.exception("TRAINING STOPPED at update %d; the learner keeps storing what robots send, but "
                          "publishes no new weights until it is restarted", self.step)

    def _log_progress(self) -> None:
        now = time.monotonic()
        if now - self._last_log_s >= 10.0:
            self._last_log_s = now
            log.info("update %d  loss %.4f  streams %s  weights v%d", self.step,
                     self.last_metrics.get("loss", float("nan")), self.index.counts(), self.version)

    # ------------------------------------------------------------ checkpoints

    def checkpoint(self) -> Path:
        with self._lock:
            return self._checkpoint_locked()

    def save_deployed(self, directory: str | Path) -> tuple[int, int]:
        """The weights robots would get now, as a loadable policy directory (no optimiser state:
        for evaluating a run's weights over time). Returns (update step, weights version)."""
        with self._lock:
            self.deployed.save_pretrained(directory)
            return self.step, self.version

    def optimizer_states(self) -> dict[str, dict]:
        """Every optimiser's state, by name, as a checkpoint holds it."""
        return {name: optimizer.state_dict() for name, optimizer in self.algorithm.optimizers().items()}

    def _checkpoint_locked(self) -> Path:
        extra = {n: m.state_dict() for n, m in self.algorithm.extra_modules().items()}
        if self.average is not None:
            extra[TRAINING_WEIGHTS] = self.policy.state_dict()
        state = ckpt.TrainerState(
            step=self.step,
            version=self.version,
            optimizers=self.optimizer_states(),
            torch_rng=torch.get_rng_state(),
            algorithm_rng=self.algorithm.rng_state(),
            numpy_rng=self._prefetch.next_rng_state(),  # the state that draws the next batch trained on
            extra_modules=extra,
            cuda_rng=list(torch.cuda.get_rng_state_all()) if torch.cuda.is_available() else [],
            index_manifest=self.index.manifest(),
            config_hash=self.policy.config_hash(),
        )
        path = ckpt.write_checkpoint(self.config.checkpoint_dir, self.deployed, state, self.config.keep_checkpoints)
        if self._on_checkpoint is not None:
            self._on_checkpoint(path)
        return path

    def resume(self, path: str | Path | None = None, *, check_index: bool = True) -> Path:
        """Restore from ``path`` (default: the latest checkpoint in ``checkpoint_dir``).

        Whether the store's index is the one the checkpoint trained on is said when training starts
        (``start``), not here: a restarted store reads its dataset into the index behind the serving
        learner, and a resume that waited for that read would keep robots waiting as long.
        ``check_index=False`` for a data-parallel follower rank, whose index stays empty.
        """
        path = Path(path) if path is not None else latest_checkpoint(self.config.checkpoint_dir)
        if path is None:
            raise FileNotFoundError(f"no checkpoint to resume from in {self.config.checkpoint_dir}; "
                                    "start without --resume to train from the initial weights")
        weights, state = ckpt.read_checkpoint(path)
        if state.config_hash != self.policy.config_hash():
            raise ValueError(f"checkpoint {path} was trained with policy config {state.config_hash[:12]}, this "
                             f"learner runs {self.policy.config_hash()[:12]}; use the same policy config to resume")
        with self._lock:
            # The model is the average when one was kept; the training weights then travel in the state.
            self.policy.load_state_dict(state.extra_modules.get(TRAINING_WEIGHTS, weights))
            if self.average is not None:
                self.average.module.load_state_dict(weights)
            for name, optimizer in self.algorithm.optimizers().items():
                optimizer.load_state_dict(state.optimizers[name])
            for name, module in self.algorithm.extra_modules().items():
                module.load_state_dict(state.extra_modules[name])
            torch.set_rng_state(state.torch_rng)
            if state.cuda_rng and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(state.cuda_rng)
            self.algorithm.set_rng_state(state.algorithm_rng)
            self._prefetch.discard()  # a batch drawn ahead from the state being replaced
            self.rng.bit_generator.state = state.numpy_rng
            self.step, self.version = state.step, state.version
            self.algorithm.set_policy_version(self.version)
        if check_index:
            self._resumed_manifest = state.index_manifest
        log.info("resumed from %s at update %d (weights v%d)", path, self.step, self.version)
        return path

    def _check_manifest(self, saved: list[list]) -> None:
        """Say whether the rebuilt index is the checkpointed one (sampling is exact only then)."""
        current = self.index.manifest()
        if current == saved:
            log.info("store index matches the checkpoint (%d entries)", len(saved))
            return
        lost = [e for e in saved if e not in current and [*e[:3]] not in [c[:3] for c in current]]
        if lost:
            log.error("the store lost %d entries the checkpoint trained on (e.g. %s); was the store moved?",
                      len(lost), lost[:3])
        else:
            log.info("the store holds more data than at the checkpoint (%d vs %d entries); "
                     "training continues on all of it", len(current), len(saved))
