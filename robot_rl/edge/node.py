"""EdgeNode: the control loop of one robot, under the timing contract written out here.

Each tick (1/fps):
  1. wait for the tick's scheduled time (wall clock: sleep; virtual clock: jump) and
     measure how late it started;
  2. run the ``on_tick`` hook (benchmarks perturb the world here), read the observation;
  3. collect a finished chunk and splice it, then ask for a new one (then collect again,
     so a zero-latency runner lands in the same tick): thrifty re-planning asks when
     ``remaining <= threshold`` and no request is in flight; continuous re-planning asks
     whenever one of its request slots is free, staggered over one inference
     (``edge.replan``; "auto" picks continuous where the policy's measured compute affords it);
  4. pick the action: the human's if intervening, else the queue's head, else hold the
     last commanded position (a stall, or a wait by design);
  5. clamp the per-tick joint change, send it, record a Step.

Tick 0 is the exception by design (``plan_before_start``): the first chunk is computed
with the arm at rest before the episode's clock starts, since nothing can move before a
plan exists.

The control loop never waits for inference (the worker computes off this thread or in
virtual time), the network or the disk (``step_sink`` must only enqueue). The three modes
run this same loop; ``ModeRules`` holds their few differences.

Time alignment (ticks): a request at tick n notes the executed index k and the delay
estimate d. With roll-forward the policy gets the target planned for tick n+d-1, i.e.
chunk[k+d], and the new chunk's action 0 is meant for tick n+d; without it the policy gets
the measured state and action 0 is meant for tick n. When the chunk can be used at tick
m = n + d' (d' = measured delay), actions meant for ticks before m are stale and dropped
(async_naive drops d'; async_rollforward drops d'-d, or keeps the old plan for d-d' more
ticks if the chunk came early). Sync holds while the chunk is computed, so its chunk
starts at index 0 on arrival and nothing is stale.

Observation history: a policy that reads past observations (``HistoryChunkPolicy``, e.g. Diffusion
with ``n_obs_steps=2``) gets, with each request, the images and measured states of the ticks before
it (kept per episode); the request's own observation comes last, with the rolled-forward state, as
the learner's samples pair recorded past observations with an offset state (``policies.augment``).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

import numpy as np

from robot_rl.core.clock import Clock
from robot_rl.core.motion_limits import JointDeltaClamp, step_limit_per_tick
from robot_rl.core.priority import interpreter_switch_interval, realtime_thread
from robot_rl.core.types import UNJUDGED, ActionChunk, Episode, Step, VerdictSource
from robot_rl.edge.action_queue import ActionQueue, QueuedAction
from robot_rl.edge.config import EdgeConfig
from robot_rl.edge.delay import DelayEstimator
from robot_rl.edge.inference import InferenceRequest, InferenceResult, InferenceWorker, PolicySwap, make_worker
from robot_rl.edge.stats import ChunkRecord, EdgeStats
from robot_rl.edge.swap import WeightSwap
from robot_rl.hardware.robot import InvalidActionError, Observation, Robot, validate_action
from robot_rl.policies.base import ChunkPolicy, GuidedChunkPolicy, HistoryChunkPolicy, PastObservation

log = logging.getLogger(__name__)


class EpisodeTask(Protocol):
    """Reward and success of the current episode (the sim robot provides both)."""

    def reward(self) -> float: ...

    def is_success(self) -> bool: ...


Intervention = Callable[[Observation], "np.ndarray | None"]  # human action, or None = policy drives
StepSink = Callable[[Step], None]  # must not block: enqueue and return
PlanSink = Callable[["PlanUpdate"], None]  # must not block either (a live view's queue)
TickHook = Callable[["EdgeNode", int], None]  # runs at the start of each tick, before the observation
DonePredicate = Callable[[Step], bool]


def at_tick(tick: int, action: Callable[[EdgeNode], Any]) -> TickHook:
    """An ``on_tick`` hook that runs ``action(node)`` once, at ``tick`` (e.g. move the target)."""

    def hook(node: EdgeNode, now_tick: int) -> None:
        if now_tick == tick:
            action(node)

    return hook


@dataclass(frozen=True)
class PlanUpdate:
    """A chunk spliced into the queue at ``tick``: what the queue was executing from that tick on, and
    the new chunk, whose action 0 is meant for ``tick + start_offset`` (negative: its first actions
    were stale and dropped; positive: the old plan runs that many ticks more)."""

    tick_index: int  # the node's control ticks before this one, across episodes
    tick: int  # the tick in the episode
    chunk_id: int
    policy_version: int
    executing: np.ndarray  # [m, joints]: the old plan from this tick on (empty when nothing was queued)
    chunk: np.ndarray  # [H, joints]: the new chunk as predicted
    start_offset: int
    rolled_state: np.ndarray | None  # the rolled-forward state the policy was given (None: measured)


@dataclass(frozen=True)
class _Choice:
    """What this tick executes and why."""

    action: np.ndarray
    policy_action: np.ndarray | None = None
    source: QueuedAction | None = None
    is_intervention: bool = False
    stall: bool = False
    waiting: bool = False


class EdgeNode:
    """Runs one robot with a chunking policy under the timing contract; see the module doc."""

    def __init__(
        self,
        robot: Robot,
        policy: ChunkPolicy,
        clock: Clock,
        config: EdgeConfig | None = None,
        *,
        task: EpisodeTask | None = None,
        intervention: Intervention | None = None,
        step_sink: StepSink | None = None,
        on_tick: TickHook | None = None,
        done: DonePredicate | None = None,
        policy_version: int = 0,
        worker: InferenceWorker | None = None,
        robot_id: str | None = None,
    ) -> None:
        self.robot = robot
        self.clock = clock
        self.config = config or EdgeConfig()
        self.rules = self.config.rules
        self.task = task
        self.intervention = intervention
        self.step_sink = step_sink
        self.plan_sink: PlanSink | None = None  # a live view of the plans (robot_rl.edge.rerun_view)
        self.on_tick = on_tick
        self.done = done
        self.robot_id: str = robot_id or str(getattr(robot, "name", "robot"))
        self.instruction = ""

        self._joint_names = tuple(robot.joint_names)
        action_dim = len(self._joint_names)
        policy_dim = getattr(policy, "action_dim", action_dim)
        if policy_dim != action_dim:
            raise ValueError(
                f"policy predicts {policy_dim}-dim actions but robot {self.robot_id!r} has {action_dim} joints "
                f"{list(self._joint_names)}; use a policy trained for this robot"
            )
        if self.config.real_time_chunking and not isinstance(policy, GuidedChunkPolicy):
            raise ValueError(f"edge.real_time_chunking needs a flow policy that takes a frozen prefix (FlowVLA, or a "
                             f"LeRobot SmolVLA, pi0 or pi0.5); {type(policy).__name__} does not")
        robot_fps = getattr(robot, "fps", self.config.fps)
        if robot_fps != self.config.fps:
            log.warning("robot %s runs at %s fps but the edge ticks at %d fps", self.robot_id, robot_fps,
                        self.config.fps)
        self._lower, self._upper = (np.asarray(x, dtype=np.float32) for x in robot.joint_limits)

        self.worker: InferenceWorker = worker or make_worker(policy, policy_version, action_dim, clock, self.config)
        self.queue = ActionQueue()
        self.delay = DelayEstimator(self.config.delay_window, self.config.delay_quantile, self.config.delay_prior_ticks)
        # Every target (policy, human, hold) moves each joint at most this far per tick.
        self.clamp = JointDeltaClamp(step_limit_per_tick(
            getattr(robot, "max_joint_velocity", None), self.config.fps, self.config.max_joint_delta_per_tick,
            action_dim), action_dim)
        self.stats = EdgeStats()
        # Re-planning: continuous with this many slots from the start, or (auto) from what the first
        # chunks cost (_replan_slots); thrifty until then.
        self.stats.replan_slots = self.worker.max_inflight if self.config.replan == "continuous" and \
            not self.config.thrifty else 0
        self._costs: deque[tuple[float, float]] = deque(maxlen=self.config.delay_window)  # (device, latency) s

        self._policy_version = policy_version
        # New weights for a policy that runs here: offered by a loader thread (``request_policy_swap``),
        # taken with the next request, settled when its result comes back (``robot_rl.edge.swap``). A
        # policy in its own process keeps the rule there and never offers here.
        self.swaps = WeightSwap(policy, policy_version)
        self._next_chunk_id = 0
        self._generation = 0
        # What the robot saw at the last ticks, for a policy that reads past observations (Diffusion's
        # n_obs_steps): each request carries them, the observation of its own tick comes last.
        steps = policy.observation_history.steps if isinstance(policy, HistoryChunkPolicy) else 1
        self._seen: deque[PastObservation] = deque(maxlen=steps - 1)
        self._last_late_warning = float("-inf")
        self._late_since_warning = 0
        self._last_tick_time: float | None = None
        self._ease: tuple[JointDeltaClamp, int] | None = None  # after a hand-back: (bound, policy ticks left)
        self.hand_backs = 0  # takeovers that ended with a hand-back (hand_back calls)
        self.reset_episode("")

    # ----------------------------------------------------------------- public API

    @property
    def tick_index(self) -> int:
        """The tick the next call to ``tick`` will execute (0 at the start of an episode)."""
        return self._tick

    @property
    def policy_version(self) -> int:
        """The version of the weights that produced the most recent chunk."""
        return self._policy_version

    @property
    def last_command(self) -> np.ndarray | None:
        """The joint target sent last (what the robot holds when nothing is planned)."""
        return self._hold

    def request_threshold(self) -> int:
        """Ask for a new chunk when at most this many actions remain.

        Sync: 0 (its queue holds only the execution horizon). Async: the configured value,
        or delay estimate + margin, so the chunk lands before the old one runs out, and never
        below ``min_request_threshold``, so fast inference still re-plans often (closed loop).
        """
        if self.rules.waits_for_chunk:
            return 0
        if self.config.request_threshold is not None:
            return self.config.request_threshold
        return max(self.delay.estimate() + self.config.threshold_margin, self.config.min_request_threshold)

    def request_policy_swap(self, new: ChunkPolicy | Mapping[str, Any], version: int) -> None:
        """Use ``new`` (a policy, or a state dict for the current one) from the next chunk on.

        Applied by the inference worker right before it computes the next chunk, so it
        never happens mid-chunk and never on the control thread (no late tick). The
        latest request wins if several arrive between two chunks.
        """
        if hasattr(new, "predict_chunk"):
            swap = PolicySwap(version=version, policy=cast(ChunkPolicy, new))  # it predicts: a policy
        elif isinstance(new, Mapping):
            swap = PolicySwap(version=version, state_dict=new)
        else:
            raise TypeError(f"request_policy_swap needs a ChunkPolicy or a state dict, got {type(new).__name__}")
        self.swaps.offer(swap)

    def withdraw_policy_swap(self, policy: object) -> bool:
        """Take back a ``request_policy_swap(policy, ...)`` the control thread has not handed to
        the worker yet; True if it was still pending (it will then never run).

        Atomic with the hand-over, so a caller that gets True knows nothing will read ``policy``
        and may write new weights into it.
        """
        return self.swaps.withdraw(policy)

    @property
    def running_policy(self) -> ChunkPolicy:
        """The policy the inference worker computes chunks with now (a swap changes it between chunks)."""
        return self.worker.running_policy

    def reset_episode(self, instruction: str = "", scene_seed: int | None = None) -> None:
        """Start a new episode: empty plan, tick 0 now, answers to old requests ignored.
        ``scene_seed``: the sim seed the scene was set up with (None: a real scene); every Step
        carries it, so the learner's store and replay can re-create exactly the sim's scenes."""
        self.instruction = instruction
        self.scene_seed = -1 if scene_seed is None else int(scene_seed)
        self.queue.clear()
        self._generation += 1
        self._tick = 0
        # The first tick of a new episode comes one period after the last tick, not at
        # the same instant (a virtual clock has not moved during the reset).
        last = self._last_tick_time
        self._t0 = self.clock.now() if last is None else max(self.clock.now(), last + self.config.period_s)
        self._hold: np.ndarray | None = None
        self._had_chunk = False
        self._episode_limit: int | None = None
        self._ease = None
        self._last_request_tick = -1
        self._newest_spliced_id = -1
        self._seen.clear()  # a new episode's first request repeats its own observation, as LeRobot's queues do

    def hand_back(self, ease_step: np.ndarray | float | None = None, ease_ticks: int = 0) -> None:
        """A human hands control back to the policy: forget the plan, ask for a fresh chunk.

        The queued plan (and any chunk still being computed) was made from where the arm
        was before or during the takeover; executing it would yank the arm back along the
        old path. So the queue is flushed, answers to earlier requests are ignored, and the
        next tick asks for a chunk from the measured state. The arm holds the human's last
        target until it arrives, counted as waiting by design, not as a stall.

        The new chunk starts where the policy thinks the arm should be, which may be far from
        the human's last target: until the commands catch up with the plan (at most
        ``ease_ticks`` policy actions) each joint moves by at most ``ease_step`` per tick (the
        takeover blender's bound), so a hand-back is as gentle as a takeover, on top of the
        robot's velocity limit.
        """
        self.queue.clear()
        self._generation += 1
        self._had_chunk = False
        self.hand_backs += 1
        if ease_step is not None and ease_ticks > 0:
            self._ease = (JointDeltaClamp(ease_step, len(self._joint_names)), int(ease_ticks))

    def tick(self) -> Step:
        """Run one control tick and return its Step."""
        n = self._tick
        time_s, lateness = self._wait_for_tick(n)
        if self.on_tick is not None:
            self.on_tick(self, n)
        obs = self.robot.get_observation()
        state = np.asarray(obs["state"], dtype=np.float32).copy()
        if self._hold is None:
            self._hold = state.copy()  # first tick: "hold" means stay where the arm is
        human = self._read_human(obs)
        if n == 0 and human is None and self.config.plan_before_start:
            time_s = self._plan_before_start(obs, state)

        self._collect(n)
        self._maybe_request(n, obs, state, intervening=human is not None)
        self._collect(n)
        if self._seen.maxlen:  # the control thread builds nothing for a policy that reads one observation
            self._seen.append(PastObservation(dict(obs["images"]), state))

        choice = self._choose(human)
        sent = self._send(choice)
        step = self._record(n, time_s, lateness, obs, state, choice, sent)
        self._tick += 1
        return step

    def run_episode(
        self,
        max_steps: int,
        instruction: str = "",
        *,
        episode_id: int = 0,
        seed: int | None = None,
        task_family: str = "",
    ) -> Episode:
        """Tick until the done predicate (default: task success) or ``max_steps``.

        Reset the task (e.g. ``sim.reset(...)``) before calling; pass its instruction.
        The last Step is marked done whether the episode succeeded or was cut at max_steps.
        """
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if not getattr(self.robot, "is_connected", True):
            raise RuntimeError(f"robot {self.robot_id!r} is not connected; call robot.connect() first")
        self.reset_episode(instruction, seed)
        self._episode_limit = max_steps
        episode = Episode(self.robot_id, episode_id, instruction, task_family=task_family, seed=seed)
        with self.realtime():
            for _ in range(max_steps):
                step = self.tick()
                episode.steps.append(step)
                if step.done:
                    break
        episode.success = any(s.success for s in episode.steps)
        return episode

    @contextlib.contextmanager
    def realtime(self) -> Iterator[bool]:
        """Around a loop of ticks: on the wall clock the calling thread runs under SCHED_FIFO at
        ``edge.realtime_priority`` (where the OS permits; yields whether it does), so no thread of
        normal priority delays a tick, and the interpreter lock changes hands after
        ``edge.switch_interval_ms``, so no thread of this process holds it from a waking tick for
        longer. Nothing changes on a virtual clock, which never waits, nor for a simulated robot
        (``simulated``): its tick steps the physics and renders the cameras, work with no physical
        deadline that would otherwise run ahead of the learner and the policy's thread."""
        if self.clock.is_virtual or getattr(self.robot, "simulated", False):
            yield False
            return
        with (interpreter_switch_interval(self.config.switch_interval_ms / 1000.0),
              realtime_thread(self.config.realtime_priority) as applied):
            yield applied

    def close(self) -> None:
        """Stop the inference worker (joins its thread, if any)."""
        self.worker.close()

    def __enter__(self) -> EdgeNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- timing

    def _warn_late(self, n: int, lateness: float) -> None:
        """Say a tick was a whole period late, at most once a second (an overloaded
        machine makes every tick late, and a warning per tick would bury the log)."""
        now = self.clock.now()
        self._late_since_warning += 1
        if now - self._last_late_warning >= 1.0:
            log.warning("tick %d started %.1f ms late (%d such ticks in the last second); re-anchoring the schedule",
                        n, lateness * 1000.0, self._late_since_warning)
            self._last_late_warning = now
            self._late_since_warning = 0

    def _wait_for_tick(self, n: int) -> tuple[float, float]:
        """Sleep until tick n's scheduled time; return (start time, lateness).

        A tick more than a whole period late re-anchors the schedule instead of firing a
        burst of catch-up ticks, which would run the arm's plan faster than planned.
        """
        scheduled = self._t0 + n * self.config.period_s
        self.clock.sleep_until(scheduled)
        now = self.clock.now()
        lateness = max(0.0, now - scheduled)
        if lateness * 1000.0 > self.config.late_threshold_ms:
            self.stats.late_ticks += 1
            if lateness >= self.config.period_s:
                self._warn_late(n, lateness)
                self._t0 += lateness
        self.stats.max_lateness_s = max(self.stats.max_lateness_s, lateness)
        self.stats.recent_lateness_s.append(lateness)
        self._last_tick_time = now
        return now, lateness

    # ----------------------------------------------------------------- inference

    def _maybe_request(self, n: int, obs: Observation, state: np.ndarray, intervening: bool) -> None:
        slots = self.stats.replan_slots  # 0: thrifty
        if self.worker.in_flight >= max(slots, 1):
            return
        if not slots and self.queue.remaining > self.request_threshold():
            return
        estimate = self.delay.estimate()
        if self.worker.busy and n - self._last_request_tick < self._stagger_ticks(estimate, max(slots, 1)):
            return
        last = self.queue.last_taken
        executed_index = last.chunk_index if last is not None else -1
        holding = self.queue.remaining == 0 and not intervening

        if not self.rules.drops_stale or holding:
            # The arm stands still until the chunk arrives, so none of it can go stale.
            delay_used, policy_state, rolled, start = 0, state, None, None
        elif self.rules.rolls_forward and not intervening:
            delay_used = estimate
            # Where the arm will be *read* to be when the chunk starts: the target commanded
            # command_lag_ticks before that (the policy learnt from measured states).
            target = self.queue.planned_target(max(0, estimate - self.config.command_lag_ticks))
            target = self._hold if target is None else target  # nothing taken yet: where it stands
            assert target is not None  # tick 0 sets the hold before any request
            rolled = np.clip(target, self._lower, self._upper).astype(np.float32)
            policy_state, start = rolled, n + estimate
        else:
            # async_naive, or a human driving (their future is unknown): measured state.
            delay_used, policy_state, rolled, start = 0, state, None, n
        prefix = self._frozen_prefix() if self.config.real_time_chunking and not intervening else None

        request = InferenceRequest(
            chunk_id=self._next_chunk_id,
            request_tick=n,
            request_time_s=self.clock.now(),
            images=obs["images"],
            state=policy_state,
            instruction=self.instruction,
            executed_index=executed_index,
            delay_ticks=delay_used,
            delay_estimate=estimate,
            start_tick=start,
            rolled_state=rolled,
            generation=self._generation,
            swap=self.swaps.take(),
            prefix=prefix,
            history=tuple(self._seen),
        )
        self._next_chunk_id += 1
        self._last_request_tick = n
        self.stats.inferences += 1
        self.stats.delay_estimates.append(estimate)
        self.stats.chunks.append(
            ChunkRecord(request.chunk_id, n, executed_index, estimate, delay_used, start, policy_state,
                        self.queue.remaining)
        )
        self.worker.submit(request)

    def _frozen_prefix(self) -> np.ndarray | None:
        """Real-time chunking: the actions the queue executes from this tick on (None: nothing queued)."""
        pending = self.queue.pending()
        return np.stack([entry.action for entry in pending]).astype(np.float32) if pending else None

    def _plan_before_start(self, obs: Observation, state: np.ndarray) -> float:
        """Compute the first chunk with the arm at rest, then start the episode's clock.

        Returns the (re-anchored) time of tick 0. The inference's latency is a real
        measurement, so it seeds the delay estimator in ticks. An answer to the previous
        episode still in flight is waited out and dropped (its slot is needed). If the
        chunk takes longer than ``first_chunk_timeout_s`` the episode starts anyway: the
        arm holds and the chunk lands whenever it is ready, as any late chunk does.
        """
        deadline = self.clock.now() + self.config.first_chunk_timeout_s
        poll_s = 0.005  # a wall clock sleeps between polls (a spin would starve the inference thread)
        requested = False
        result = None
        while self.clock.now() < deadline:
            if not requested:
                before = self._next_chunk_id
                self._maybe_request(0, obs, state, intervening=False)
                requested = self._next_chunk_id > before
            result = self.worker.poll(self.clock.now())
            if result is not None and result.request.generation == self._generation:
                break
            if result is not None:  # the previous episode's answer: its chunk is dropped, but a swap it
                self._take_result(0, result)  # carried is settled, or the shadow stays taken for good
                continue
            self.clock.sleep_until(self.clock.now() + poll_s)
        self._t0 = self.clock.now()
        if result is None or result.request.generation != self._generation:
            log.warning("first chunk not ready after %.1f s; starting the episode holding",
                        self.config.first_chunk_timeout_s)
            return self._t0
        self._take_result(0, result, measured=math.ceil(result.latency_s * self.config.fps - 1e-9))
        return self._t0

    def _stagger_ticks(self, estimate: int, slots: int) -> int:
        """Ticks between two requests in flight together: they spread over one inference."""
        return max(1, -(-estimate // slots))

    def _replan_slots(self) -> int:
        """``edge.replan=auto``: the most request slots whose device time (the compute, or what a
        virtual runner models) fits ``replan_duty`` of the time between two requests (the median
        latency of recent chunks, at least a tick); 0: thrifty."""
        compute = float(np.median([c for c, _ in self._costs]))
        interval = max(float(np.median([latency for _, latency in self._costs])), self.config.period_s)
        for slots in range(self.worker.max_inflight, 0, -1):
            if slots * compute <= self.config.replan_duty * interval:
                return slots
        return 0

    def _collect(self, n: int) -> None:
        """Take every finished inference and splice it into the queue, oldest first."""
        while (result := self.worker.poll(self.clock.now())) is not None:
            self._take_result(n, result)

    def _take_result(self, n: int, result: InferenceResult, measured: int | None = None) -> None:
        """Splice ``result`` if it is still wanted; ``measured`` overrides the delay in ticks
        (computed from arrival tick - request tick, except for a chunk planned before start)."""
        request = result.request
        if request.swap is not None:  # applied or refused whatever the episode: the shadow is free again
            self.swaps.settle(request.swap, result.swap_error)
        # Counted whatever the episode too: a policy process swaps with the next request it takes,
        # which may be the last one of the episode before (its chunk is then dropped below).
        self._note_swap(result)
        if request.generation != self._generation:
            log.debug("dropping chunk %d: it was requested in a previous episode", request.chunk_id)
            return
        if measured is None:
            measured = n - request.request_tick
        self.delay.observe(measured)
        self.stats.measured_delays.append(measured)
        self.stats.inference_latency_s.append(result.latency_s)
        if self.config.replan == "auto" and not self.config.thrifty:
            device = result.device_s if result.device_s is not None else result.compute_s
            self._costs.append((device, result.latency_s))
            self.stats.replan_slots = self._replan_slots()
        record = self._record_for(request.chunk_id)
        if record is not None:
            record.arrival_tick, record.measured_delay = n, measured
            record.policy_version, record.latency_s, record.compute_s = (
                result.policy_version, result.latency_s, result.compute_s)
        if request.chunk_id < self._newest_spliced_id:
            # With requests in flight together, a slow answer can arrive after a newer one:
            # the newer plan saw a later image, so the older one is superseded.
            self.stats.chunks_superseded += 1
            return
        if result.chunk is None:
            self.stats.chunks_rejected += 1
            if record is not None:
                record.error = result.error
            log.error("chunk %d rejected, not executed (the current plan continues): %s", request.chunk_id,
                      result.error)
            return
        self._splice(n, result, record)

    def _note_swap(self, result: InferenceResult) -> None:
        if result.request.swap is None:
            return
        if result.swap_error is not None:
            self.stats.swap_failures += 1
        else:
            self.stats.swaps += 1
        self._policy_version = result.policy_version

    def _splice(self, n: int, result: InferenceResult, record: ChunkRecord | None) -> None:
        chunk, request = result.chunk, result.request
        assert chunk is not None
        offset = 0 if request.start_tick is None else request.start_tick - n
        stale, keep = max(0, -offset), max(0, offset)
        limit = self.config.execution_horizon if self.rules.waits_for_chunk else None
        usable = chunk.horizon if limit is None else min(limit, chunk.horizon)
        if stale >= usable:
            self.stats.chunks_expired += 1
            log.warning(
                "chunk %d arrived %d ticks late with only %d usable actions; all stale, discarded",
                chunk.chunk_id, stale, usable)
            return
        if self.plan_sink is not None:
            self._emit_plan(n, chunk, offset, request.rolled_state)
        queued = self.queue.splice(
            chunk, stale=stale, keep=keep, limit=limit, blend_ticks=self.config.blend_ticks, hold=self._hold,
            ensemble_coeff=self.config.temporal_ensemble_coeff)
        self._policy_version = chunk.policy_version
        self._newest_spliced_id = chunk.chunk_id
        self._had_chunk = True
        self.stats.chunks_spliced += 1
        self.stats.stale_actions_dropped += stale
        if record is not None:
            record.stale_dropped, record.old_kept, record.queued = stale, self.queue.remaining - queued, queued

    def _emit_plan(self, n: int, chunk: ActionChunk, offset: int, rolled_state: np.ndarray | None) -> None:
        assert self.plan_sink is not None
        pending = self.queue.pending()
        executing = (np.stack([entry.action for entry in pending]) if pending
                     else np.empty((0, chunk.actions.shape[1]), np.float32))
        update = PlanUpdate(self.stats.ticks, n, chunk.chunk_id, chunk.policy_version, executing, chunk.actions,
                            offset, rolled_state)
        try:
            self.plan_sink(update)
        except Exception:  # a view's trouble must not stop the arm
            self.stats.sink_errors += 1
            log.exception("plan_sink failed at tick %d; the robot keeps running", n)

    def _record_for(self, chunk_id: int) -> ChunkRecord | None:
        # Answers usually come in request order: search from the newest record.
        for record in reversed(self.stats.chunks):
            if record.chunk_id == chunk_id:
                return record
        return None

    # ----------------------------------------------------------------- acting

    def _read_human(self, obs: Observation) -> np.ndarray | None:
        """The teleop action, if a human is intervening. A failing device holds the arm
        (counted as an invalid human action) rather than silently handing back to the policy."""
        if self.intervention is None:
            return None
        try:
            return self.intervention(obs)
        except Exception:
            self.stats.invalid_human_actions += 1
            log.exception("intervention provider failed at tick %d; holding", self._tick)
            return self._hold

    def _choose(self, human: np.ndarray | None) -> _Choice:
        """Arbiter: human > queue head > hold. The queue advances even under a human,
        so its plan stays aligned with time and the policy's would-be action is recorded."""
        planned = self.queue.take()
        if human is not None:
            shadow = planned.policy_action if planned is not None else None
            return _Choice(np.asarray(human), policy_action=shadow, is_intervention=True)
        if planned is not None:
            return _Choice(planned.action, policy_action=planned.policy_action, source=planned)
        assert self._hold is not None
        waiting = self.worker.busy and (self.rules.waits_for_chunk or not self._had_chunk)
        return _Choice(self._hold, stall=not waiting, waiting=waiting)

    def _send(self, choice: _Choice) -> np.ndarray:
        """Clamp, send, and remember what was actually commanded (the next hold position)."""
        assert self._hold is not None
        target = choice.action
        if choice.is_intervention:
            try:
                target = validate_action(target, self._joint_names)
            except InvalidActionError as exc:
                self.stats.invalid_human_actions += 1
                log.error("teleop action rejected, holding instead: %s", exc)
                target = self._hold
        target = self.clamp(np.asarray(target, dtype=np.float32), self._hold)
        if self._ease is not None:
            target = self._eased(choice, target)
        sent = np.asarray(self.robot.send_action(target), dtype=np.float32)
        self._hold = sent.copy()
        return sent

    def _eased(self, choice: _Choice, target: np.ndarray) -> np.ndarray:
        """A policy action right after a hand-back, under the hand-back's bound (see ``hand_back``)."""
        assert self._ease is not None and self._hold is not None
        if choice.is_intervention:  # taken over again before the policy moved: nothing to ease
            self._ease = None
            return target
        if choice.source is None:  # still holding, waiting for the first chunk
            return target
        bound, left = self._ease
        eased = bound(target, self._hold)
        caught_up = bool(np.array_equal(eased, target))
        self._ease = None if caught_up or left <= 1 else (bound, left - 1)
        return eased

    def _record(
        self, n: int, time_s: float, lateness: float, obs: Observation, state: np.ndarray, choice: _Choice,
        sent: np.ndarray,
    ) -> Step:
        source = choice.source
        reward = float(self.task.reward()) if self.task is not None else 0.0
        success = bool(self.task.is_success()) if self.task is not None else False
        # A robot with a task oracle (the sim) is judged by it at every tick; one without (a real arm)
        # leaves the verdict to whoever can give it: an operator, or the learner's success detector.
        judged = self.task is not None
        step = Step(
            tick=n,
            time_s=time_s,
            state=state,
            action=sent,
            images=obs["images"],
            instruction=self.instruction,
            policy_action=None if choice.policy_action is None else np.array(choice.policy_action, dtype=np.float32),
            is_intervention=choice.is_intervention,
            reward=reward,
            success=success,
            success_source=VerdictSource.task.value if judged else UNJUDGED,
            success_confidence=1.0 if judged else 0.0,
            policy_version=source.policy_version if source is not None else self._policy_version,
            chunk_id=source.chunk_id if source is not None else -1,
            chunk_index=source.chunk_index if source is not None else -1,
            delay_ticks=source.delay_ticks if source is not None else 0,
            rolled_state=source.rolled_state if source is not None else None,
            stall=choice.stall,
            lateness_s=lateness,
            scene_seed=self.scene_seed,
        )
        step.done = self._is_done(step)
        self._count(choice)
        self._emit(step)
        return step

    def _is_done(self, step: Step) -> bool:
        if self._episode_limit is not None and step.tick + 1 >= self._episode_limit:
            return True
        if self.done is not None:
            return bool(self.done(step))
        return step.success

    def _count(self, choice: _Choice) -> None:
        self.stats.ticks += 1
        self.stats.stall_ticks += choice.stall
        self.stats.wait_ticks += choice.waiting
        self.stats.intervention_ticks += choice.is_intervention

    def _emit(self, step: Step) -> None:
        if self.step_sink is None:
            return
        try:
            self.step_sink(step)
        except Exception:  # recording trouble must not stop the arm mid-motion
            self.stats.sink_errors += 1
            log.exception("step_sink failed at tick %d; the robot keeps running", step.tick)
