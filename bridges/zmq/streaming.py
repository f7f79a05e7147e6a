"""``StreamingClient``: the edge's link to the learner, off the control thread.

The control thread must never wait for the network or the disk. It hands steps
to ``submit_steps``, which only puts them in a bounded in-memory queue. A
background thread takes them from there, encodes the segment (JPEG/PNG), writes
it to the spool (fsync) and sends it, and also runs heartbeats and weight fetches.

Backpressure policy (never a silent drop): when the queue is full -- the
background thread cannot keep up, or the spool's disk is failing -- ``submit_steps``
returns False at once, logs an ERROR (rate-limited, with the running count) and
counts it in ``stats()["queue_rejections"]``. The steps are *not* taken: the
caller still holds them and may resubmit them later (the recorder keeps the
episode anyway). Everything accepted is spooled, even on ``stop()``, and
re-sent after a restart.

Segment numbering: ``seq`` is assigned per episode in submission order, starting
at 0. Episode ids must therefore be unique per robot across process restarts
(e.g. derived from the wall-clock start time), since (robot_id, episode_id, seq)
is the learner's dedup key. Steps (and their arrays) must not be mutated after
they are submitted: they are encoded later, on the background thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from robot_rl.bridges.zmq.client import ClientConfig, WeightsCallback, ZmqClient
from robot_rl.bridges.zmq.protocol import ProtocolError, Segment, StatsMap
from robot_rl.bridges.zmq.segments import ImageEncoding, check_segment, encode_segment
from robot_rl.bridges.zmq.spool import Spool, SpoolFullError
from robot_rl.bridges.zmq.weights import BufferAllocator
from robot_rl.core import Step
from robot_rl.core.types import DetectorGuess

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Job:
    episode_id: int
    seq: int
    steps: tuple[Step, ...]
    episode_done: bool


class StreamingClient:
    """Thread-safe facade over ``ZmqClient`` for the edge node.

    >>> link = StreamingClient(ClientConfig(robot_id="so101-a", router_endpoint=..., pub_endpoint=..., spool_dir=...),
    ...                        on_weights=load_into_shadow_copy)
    >>> link.start()
    >>> link.submit_steps(episode_id, steps)   # from the control thread; never blocks
    >>> link.set_policy_version(7)             # after swapping weights; reported in heartbeats
    >>> link.stop()
    """

    def __init__(
        self,
        config: ClientConfig,
        on_weights: WeightsCallback | None = None,
        *,
        queue_size: int = 256,
        image_encoding: ImageEncoding = ImageEncoding(),
        poll_interval_ms: int = 100,
        allocate_weights: BufferAllocator | None = None,
    ) -> None:
        self.config = config
        self._allocate_weights = allocate_weights
        self.image_encoding = image_encoding
        self._on_weights = on_weights
        # The longest the link thread sleeps with nothing arriving: the granularity of its timers
        # (heartbeats every second, re-sends after seconds). New segments and ``stop`` wake it at once
        # through ``_wake_w``, so this is no latency; a short one only woke the thread (and took the
        # GIL from the control loop) hundreds of times a second for nothing.
        self._poll_ms = poll_interval_ms
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._queue: queue.Queue[_Job] = queue.Queue(maxsize=queue_size)
        self._seq_lock = threading.Lock()
        self._next_seq: dict[int, int] = {}
        self._rejections = 0
        self._last_rejection_log = 0.0
        self._encode_errors = 0
        self._policy_version = config.policy_version
        self._stop = threading.Event()
        self._started = threading.Event()
        self._drained = threading.Event()
        self._startup_error: BaseException | None = None
        self._snapshot: dict[str, int | bool] = {}
        self._refusal: str | None = None
        self._guess: DetectorGuess | None = None
        self._thread: threading.Thread | None = None
        # More of the robot's state for its heartbeats (``ZmqClient.report``); set before ``start``.
        self.report: Callable[[], StatsMap] | None = None
        self._held: _Job | None = None  # a job the spool could not take yet (disk error)
        self._spool_blocked = False  # the spool refused the held job (logged once until it takes one again)

    # ------------------------------------------------------------ control-thread API (non-blocking)

    def submit_steps(self, episode_id: int, steps: Sequence[Step], *, episode_done: bool = False) -> bool:
        """Queue a segment for sending. Never blocks. False (logged, counted) if the queue is full."""
        with self._seq_lock:
            seq = self._next_seq.get(episode_id, 0)
            try:
                self._queue.put_nowait(_Job(episode_id, seq, tuple(steps), episode_done))
            except queue.Full:
                self._rejections += 1
                self._log_rejection(episode_id, seq)
                return False
            self._next_seq[episode_id] = seq + 1  # kept after episode_done: a reused seq would be deduped away
            self._drained.clear()
        self._wake()
        return True

    def _wake(self) -> None:
        """Wake the link thread from its poll (never blocks: a full pipe already holds a wake-up)."""
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"\0")

    def set_policy_version(self, version: int) -> None:
        """The weights version now in use (reported to the learner in heartbeats)."""
        self._policy_version = version

    def stats(self) -> dict[str, int | bool]:
        """Latest counters of the link (see ``ClientStats``) plus the queue's."""
        return {**self._snapshot, "queue_rejections": self._rejections, "queue_depth": self._queue.qsize(),
                "encode_errors": self._encode_errors}

    @property
    def connected(self) -> bool:
        return bool(self._snapshot.get("connected", False))

    @property
    def detector_guess(self) -> DetectorGuess | None:
        """The learner's success detector's newest guess on one of this robot's episodes (its acks carry
        it; ``episode_id`` says which); None until one came."""
        return self._guess

    @property
    def refusal(self) -> str | None:
        """Why the learner refused this robot (config hash, CURVE key), while it does."""
        return self._refusal

    def _log_rejection(self, episode_id: int, seq: int) -> None:
        now = time.monotonic()
        if now - self._last_rejection_log >= 1.0:
            self._last_rejection_log = now
            log.error(
                "robot %s: streaming queue full (%d segments waiting); segment %d:%d NOT taken, caller keeps it "
                "(%d rejections so far). The link or the spool disk cannot keep up.",
                self.config.robot_id, self._queue.maxsize, episode_id, seq, self._rejections,
            )

    # ------------------------------------------------------------ lifecycle

    def start(self, timeout_s: float = 10.0) -> StreamingClient:
        """Start the background thread; raise here if sockets or spool cannot be set up."""
        self._thread = threading.Thread(target=self._run, name=f"zmq-link-{self.config.robot_id}", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout_s):
            raise TimeoutError(f"streaming client for {self.config.robot_id} did not start within {timeout_s} s")
        if self._startup_error is not None:
            self.stop()
            raise self._startup_error
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Spool whatever is queued, close sockets and spool. Unacked segments stay for next time."""
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.error("robot %s: streaming thread did not stop within %.1f s", self.config.robot_id, timeout_s)
                return  # it still polls the pipe
            self._thread = None
        fds, (self._wake_r, self._wake_w) = (self._wake_r, self._wake_w), (-1, -1)  # no write to a reused fd
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def wait_connected(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) for the learner's hello; False at once if it refuses this robot
        (config hash, key, layout: ``refusal``), which takes an operator to fix, not a longer wait."""
        return self._wait_for(lambda: self.connected or self._refusal is not None, timeout_s) and self.connected

    def flush(self, timeout_s: float) -> bool:
        """Wait until everything submitted so far is acked by the learner."""
        return self._drained.wait(timeout_s)

    def _wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() >= deadline:
                return False
            self._stop.wait(0.01)
        return True

    def __enter__(self) -> StreamingClient:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ background thread

    def _run(self) -> None:
        try:
            spool = Spool(self.config.spool_dir, max_bytes=self.config.spool_max_bytes)
            client = ZmqClient(self.config, self._on_weights, spool, self._allocate_weights)
        except BaseException as exc:  # noqa: BLE001 - re-raised by start() in its caller's thread
            self._startup_error = exc
            self._started.set()
            return
        client.report = self.report
        client.wake_on(self._wake_r)
        self._started.set()
        try:
            while True:
                # Drained before the stop flag and the jobs are read: a stop or a job that comes after
                # this leaves its byte for the next poll, which then returns at once.
                self._drain_wakeups()
                if self._stop.is_set():
                    break
                self._spool_queued(client, budget=8)
                client.policy_version = self._policy_version
                # Straight on while jobs wait, unless the spool refuses them: then retry at the timer's pace.
                busy = not self._queue.empty() and not self._spool_blocked
                client.poll(0 if busy else self._idle_ms(client))
                self._publish_state(client)
            self._spool_queued(client, budget=None)  # accepted means spooled, even when stopping
            if self._held is not None or not self._queue.empty():
                log.error("robot %s: stopping with %d segment(s) not spooled (disk error or a full spool)",
                          self.config.robot_id, self._queue.qsize() + (self._held is not None))
        except Exception:
            log.exception("robot %s: streaming thread crashed; unacked segments stay in %s",
                          self.config.robot_id, self.config.spool_dir)
        finally:
            self._publish_state(client)
            client.close()
            spool.close()

    def _idle_ms(self, client: ZmqClient) -> int:
        """How long the link may sleep with nothing arriving: ``poll_interval_ms``, or less where its
        next hello or heartbeat is due sooner (half their period: neither goes out late by more)."""
        cfg = self.config
        period_s = cfg.heartbeat_interval_s if client.connected else cfg.hello_retry_s
        return max(1, min(self._poll_ms, int(period_s * 500)))

    def _drain_wakeups(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass

    def _spool_queued(self, client: ZmqClient, budget: int | None) -> None:
        """Encode + spool + send up to ``budget`` queued jobs (all if None)."""
        done = 0
        while budget is None or done < budget:
            if self._held is not None:
                job, self._held = self._held, None
            else:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    return
            done += 1
            try:
                segment = encode_segment(self.config.robot_id, job.episode_id, job.seq, job.steps,
                                         episode_done=job.episode_done, image_encoding=self.image_encoding)
            except (ValueError, TypeError):
                self._encode_errors += 1
                log.exception("robot %s: cannot encode segment %d:%d; it is NOT sent (bad Step data)",
                              self.config.robot_id, job.episode_id, job.seq)
                continue
            try:
                refusal = _refusal(segment)
                if refusal is None:
                    client.send_segment(segment)
                else:  # what the learner would refuse never enters the spool; it is kept aside
                    client.set_aside(segment, f"refused on the edge before spooling: {refusal}")
            except (OSError, SpoolFullError) as exc:
                # Disk trouble or a full spool: keep the job, stop taking new ones; the queue fills and
                # submit_steps starts refusing loudly, which is the backpressure we want.
                self._held = job
                if not self._spool_blocked:  # said once, not at every retry
                    log.error("robot %s: cannot spool segment %d:%d (%s); it waits in memory and is retried, "
                              "later segments queue behind it", self.config.robot_id, job.episode_id, job.seq, exc)
                self._spool_blocked = True
                return
            if self._spool_blocked:
                log.warning("robot %s: spooling again (%d segment(s) waiting for acks)", self.config.robot_id,
                            client.pending)
                self._spool_blocked = False

    def _publish_state(self, client: ZmqClient) -> None:
        self._snapshot = client.stats.as_map()
        self._refusal = client.refusal
        self._guess = client.detector_guess
        with self._seq_lock:
            if self._queue.empty() and self._held is None and client.pending == 0:
                self._drained.set()


def _refusal(segment: Segment) -> str | None:
    """Why the learner would refuse ``segment`` as malformed (a NaN reward or action, an integer out
    of range), or None: the learner's own checks, run where the segment is made."""
    try:
        check_segment(segment)
    except ProtocolError as exc:
        return str(exc)
    return None
