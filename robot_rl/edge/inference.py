"""The inference worker: computes the next chunk while the robot keeps executing the current one.

One interface, two runners that share the code that calls the policy (``PolicyRunner``):

* ``ThreadedRunner``: a background thread, for the wall clock (a real policy thinks
  while the robot moves).
* ``VirtualLatencyRunner``: computes the chunk at once but releases it only when the
  clock has passed ``request time + simulated latency``, so in virtual time a CPU can
  stand in for a slow VLA on a GPU and the tick of arrival is exact.

The control thread only calls ``submit`` (when idle) and ``poll`` (non-blocking). A policy
exception or an invalid chunk comes back as a result with ``error`` set: it is counted
and logged by the node and never executed.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from robot_rl.core.clock import Clock
from robot_rl.core.types import ActionChunk
from robot_rl.edge.config import EdgeConfig
from robot_rl.edge.latency import LatencyModel
from robot_rl.policies.base import (
    ChunkPolicy,
    GuidedChunkPolicy,
    HistoryChunkPolicy,
    InvalidChunkError,
    PastObservation,
    validate_chunk,
)

log = logging.getLogger(__name__)

# Virtual times are sums of 1/fps; a chunk due at exactly a tick must not slip to the next.
_TIME_EPS = 1e-9


@dataclass(frozen=True)
class PolicySwap:
    """New weights to use from the next chunk on: a whole policy or a state dict."""

    version: int
    policy: ChunkPolicy | None = None
    state_dict: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class InferenceRequest:
    """Everything the policy needs plus what the node must remember to splice the answer.

    start_tick: the tick at which chunk[0] is meant to execute (request tick + d with
    roll-forward, the request tick without); None = the chunk starts when it arrives.
    """

    chunk_id: int
    request_tick: int
    request_time_s: float
    images: dict[str, np.ndarray]
    state: np.ndarray  # given to the policy: rolled-forward or measured
    instruction: str
    executed_index: int  # k: chunk index of the action executed last (-1 if none)
    delay_ticks: int  # d used to roll the state forward (0 when not rolling forward)
    delay_estimate: int  # the estimator's d at request time (recorded in every mode)
    start_tick: int | None
    rolled_state: np.ndarray | None
    generation: int  # episode counter: answers to requests of a past episode are dropped
    swap: PolicySwap | None = None
    # Real-time chunking: the actions the queue executes from the request tick on [T, A] (robot
    # units), which the chunk is guided to agree with over its first delay_estimate steps.
    prefix: np.ndarray | None = None
    # What the robot saw at the ticks before, oldest first, for a policy that reads past observations
    # (``HistoryChunkPolicy``); fewer than it reads at an episode's start.
    history: tuple[PastObservation, ...] = ()


@dataclass
class InferenceResult:
    request: InferenceRequest
    chunk: ActionChunk | None
    policy_version: int
    compute_s: float
    error: str | None = None
    swap_error: str | None = None
    ready_time_s: float = 0.0  # clock time at which the chunk may be used
    latency_s: float = 0.0  # ready time - request time
    # Seconds the policy's device was busy with this request, as the runner models it (None: the
    # compute time); edge.replan=auto weighs it against the latency.
    device_s: float | None = None


class PolicyRunner:
    """Owns the policy: applies weight swaps between chunks, predicts, validates.

    Only the runners call ``run``. With several requests in flight (threads), predictions
    share the policy and a swap waits until none is running (``_SwapGate``), so weights
    never change in the middle of a prediction.
    """

    def __init__(self, policy: ChunkPolicy, version: int, action_dim: int) -> None:
        self.policy = policy
        self.version = version
        self.action_dim = action_dim
        self._gate = _SwapGate()

    def announce_swap(self) -> None:
        """A request carrying a swap was handed to a thread: predictions that start later wait for it."""
        self._gate.announce()

    def run(self, request: InferenceRequest) -> InferenceResult:
        swap_error = None
        if request.swap is not None:
            with self._gate.swapping():
                swap_error = self._apply_swap(request.swap)
        with self._gate.predicting():
            policy, version = self.policy, self.version
            started = time.perf_counter()
            try:
                if request.prefix is not None:
                    if not isinstance(policy, GuidedChunkPolicy):  # a swap put in a policy without it
                        raise InvalidChunkError(f"{type(policy).__name__} takes no frozen prefix "
                                                "(edge.real_time_chunking)")
                    raw = policy.predict_chunk_guided(request.images, request.state, request.instruction,
                                                      request.prefix, request.delay_estimate)
                elif request.history and isinstance(policy, HistoryChunkPolicy):
                    raw = policy.predict_chunk_with_history(request.history, request.images, request.state,
                                                            request.instruction)
                else:
                    raw = policy.predict_chunk(request.images, request.state, request.instruction)
                actions = validate_chunk(raw, getattr(policy, "chunk_size", None), self.action_dim)
            except InvalidChunkError as exc:
                return self._failed(request, started, version, f"invalid chunk from policy v{version}: {exc}",
                                    swap_error)
            except Exception as exc:  # a policy bug must not take the robot down
                log.exception("policy v%d raised during inference of chunk %d", version, request.chunk_id)
                return self._failed(request, started, version, f"policy v{version} raised {type(exc).__name__}: {exc}",
                                    swap_error)
        compute_s = time.perf_counter() - started
        chunk = ActionChunk(
            actions=actions,
            chunk_id=request.chunk_id,
            policy_version=version,
            request_tick=request.request_tick,
            delay_ticks=request.delay_ticks,
            rolled_state=request.rolled_state,
            inference_s=compute_s,
        )
        return InferenceResult(request, chunk, version, compute_s, swap_error=swap_error)

    def _failed(self, request: InferenceRequest, started: float, version: int, error: str,
                swap_error: str | None) -> InferenceResult:
        return InferenceResult(request, None, version, time.perf_counter() - started, error=error,
                               swap_error=swap_error)

    def _apply_swap(self, swap: PolicySwap) -> str | None:
        """Install new weights; on failure keep the old ones and say why."""
        try:
            if swap.policy is not None:
                new_dim = getattr(swap.policy, "action_dim", self.action_dim)
                if new_dim != self.action_dim:
                    raise ValueError(f"new policy has action_dim {new_dim}, robot needs {self.action_dim}")
                self.policy = swap.policy
            elif swap.state_dict is not None:
                load = getattr(self.policy, "load_state_dict", None)
                if load is None:
                    raise TypeError(f"{type(self.policy).__name__} has no load_state_dict; swap in a whole policy")
                load(swap.state_dict)
            self.version = swap.version
            log.info("policy swapped to v%d between chunks", swap.version)
            return None
        except Exception as exc:  # noqa: BLE001 - a failed swap keeps the running weights and is reported; it must not stop the robot
            log.error("weight swap to v%d failed, keeping v%d: %s", swap.version, self.version, exc)
            return f"swap to v{swap.version} failed: {exc}"


class _SwapGate:
    """Predictions may run side by side; a weight swap waits until none is running.

    A swap is announced when its request is handed to an inference thread (``announce``), and a
    prediction that starts after that waits for it: otherwise a thread holding a later request could
    start on the old weights while the swap waits, and its chunk, computed by the weights just
    replaced, would be executed after the first chunk of the new ones.
    """

    def __init__(self) -> None:
        self._condition = threading.Condition()  # held through a swap's whole load
        self._predicting = 0
        self._announced = 0
        self._announce_lock = threading.Lock()  # never held long: the control thread announces

    def announce(self) -> None:
        """Called by the control thread as it submits; it must not wait for a swap being applied."""
        with self._announce_lock:
            self._announced += 1

    @contextmanager
    def predicting(self) -> Iterator[None]:
        with self._condition:
            self._condition.wait_for(lambda: self._announced == 0)
            self._predicting += 1
        try:
            yield
        finally:
            with self._condition:
                self._predicting -= 1
                self._condition.notify_all()

    @contextmanager
    def swapping(self) -> Iterator[None]:
        with self._condition:
            self._condition.wait_for(lambda: self._predicting == 0)
            try:
                yield
            finally:
                with self._announce_lock:
                    self._announced = max(0, self._announced - 1)  # a runner of one thread announces nothing
                self._condition.notify_all()


class InferenceWorker(Protocol):
    """What the node needs from a runner: up to ``max_inflight`` requests in flight."""

    max_inflight: int

    @property
    def running_policy(self) -> ChunkPolicy:
        """The policy chunks are computed with now (a swap changes it between chunks)."""
        ...

    @property
    def in_flight(self) -> int:
        """Requests submitted whose results ``poll`` has not returned yet."""
        ...

    @property
    def busy(self) -> bool:
        """True while at least one request is in flight."""
        ...

    def submit(self, request: InferenceRequest) -> None: ...

    def poll(self, now: float) -> InferenceResult | None:
        """A finished result that may be used at time ``now`` (oldest first); never blocks."""
        ...

    def close(self) -> None: ...


@dataclass
class VirtualLatencyRunner:
    """Computes on submit, releases at ``request_time_s + latency`` (virtual or wall time).

    Several requests may be in flight (``max_inflight``): each is released at its own time,
    so this stands in for an inference server that runs requests concurrently.
    """

    runner: PolicyRunner
    latency: LatencyModel
    max_inflight: int = 1
    _pending: list[InferenceResult] = field(default_factory=list, init=False)

    @property
    def running_policy(self) -> ChunkPolicy:
        return self.runner.policy

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    @property
    def busy(self) -> bool:
        return bool(self._pending)

    def submit(self, request: InferenceRequest) -> None:
        if self.in_flight >= self.max_inflight:
            raise RuntimeError(f"{self.in_flight} inferences already in flight (max {self.max_inflight}); poll first")
        result = self.runner.run(request)
        result.latency_s = self.latency.sample_s(result.compute_s)
        result.ready_time_s = request.request_time_s + result.latency_s
        result.device_s = self._device_s(result)
        self._pending.append(result)

    def _device_s(self, result: InferenceResult) -> float:
        """The simulated device's busy time, from the latency model alone, so that a virtual-clock run
        (an evaluation, a benchmark) re-plans the same on any machine: a latency drawn from the real
        compute ("measured") is a policy on this machine, busy for all of it; any other latency above
        zero stands for a remote inference server, whose compute is not this robot's to budget; zero
        latency is a local policy computing at once, which would re-plan at every tick (never affordable)."""
        if getattr(self.latency, "distribution", None) == "measured":
            return result.latency_s
        return 0.0 if result.latency_s > 0 else float("inf")

    def poll(self, now: float) -> InferenceResult | None:
        ready = [r for r in self._pending if r.ready_time_s <= now + _TIME_EPS]
        if not ready:
            return None
        result = min(ready, key=lambda r: (r.ready_time_s, r.request.chunk_id))
        self._pending.remove(result)
        return result

    def close(self) -> None:
        self._pending.clear()


class ThreadedRunner:
    """Daemon threads that run the policy (one per request allowed in flight); results are
    handed over through a queue. Several threads pay off only where the policy runs
    requests concurrently (a GPU with spare capacity, a remote server)."""

    def __init__(self, runner: PolicyRunner, clock_now: Any, max_inflight: int = 1) -> None:
        self.runner = runner
        self.max_inflight = max_inflight
        self._now = clock_now
        self._requests: queue.SimpleQueue[InferenceRequest | None] = queue.SimpleQueue()
        self._results: queue.SimpleQueue[InferenceResult] = queue.SimpleQueue()
        self._in_flight = 0  # touched by the control thread only
        self._threads = [
            threading.Thread(target=self._loop, name=f"edge-inference-{i}", daemon=True) for i in range(max_inflight)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def running_policy(self) -> ChunkPolicy:
        return self.runner.policy

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def busy(self) -> bool:
        return self._in_flight > 0

    def submit(self, request: InferenceRequest) -> None:
        if self._in_flight >= self.max_inflight:
            raise RuntimeError(f"{self._in_flight} inferences already in flight (max {self.max_inflight}); poll first")
        self._in_flight += 1
        if request.swap is not None:
            self.runner.announce_swap()  # before any thread can take a later request
        self._requests.put(request)

    def poll(self, now: float) -> InferenceResult | None:
        try:
            result = self._results.get_nowait()
        except queue.Empty:
            return None
        self._in_flight -= 1
        return result

    def close(self) -> None:
        for _ in self._threads:
            self._requests.put(None)
        for thread in self._threads:
            thread.join(timeout=5.0)
            if thread.is_alive():
                log.warning("inference thread still busy after 5 s; leaving it (daemon) to finish")

    def _loop(self) -> None:
        while (request := self._requests.get()) is not None:
            try:
                result = self.runner.run(request)
            except Exception as exc:  # never leave the node waiting on a dead thread
                log.exception("inference thread failed on chunk %d", request.chunk_id)
                result = InferenceResult(request, None, self.runner.version, 0.0, error=f"inference thread: {exc}")
            result.ready_time_s = self._now()
            result.latency_s = result.ready_time_s - request.request_time_s
            self._results.put(result)


@runtime_checkable
class SelfServingPolicy(Protocol):
    """A policy that computes somewhere else and brings the worker that reaches it: one in a process
    of its own (``robot_rl.edge.process_runner.ProcessPolicy``; a remote server plugs in the same way)."""

    def runner(self, clock_now: Callable[[], float], action_dim: int, max_inflight: int = 1) -> InferenceWorker: ...


def make_worker(
    policy: ChunkPolicy, version: int, action_dim: int, clock: Clock, config: EdgeConfig
) -> InferenceWorker:
    """The runner the config asks for. "auto": virtual on a virtual clock; on the wall clock the
    policy's own worker when it brings one (``SelfServingPolicy``), else a thread."""
    kind = config.inference_runner
    serves_itself = isinstance(policy, SelfServingPolicy)
    if kind == "auto":
        kind = "process" if serves_itself else "virtual" if clock.is_virtual else "thread"
    if (kind in ("process", "remote")) != serves_itself:
        raise ValueError(f"edge.inference_runner={kind} but the policy is {policy!r}: the process and remote runners "
                         "serve a policy built in its own process (robot_rl.edge.process_runner.spawn_policy) or on "
                         "a policy server (robot_rl.edge.remote_runner.RemotePolicy), and only those")
    if isinstance(policy, SelfServingPolicy):
        if clock.is_virtual:
            log.warning("inference in a process on a virtual clock: chunks arrive after wall time, not virtual time")
        return policy.runner(clock.now, action_dim, config.effective_max_inflight)
    runner = PolicyRunner(policy, version, action_dim)
    if kind == "thread":
        if clock.is_virtual:
            log.warning("threaded inference on a virtual clock: chunks arrive after wall time, not virtual time")
        return ThreadedRunner(runner, clock.now, config.effective_max_inflight)
    return VirtualLatencyRunner(runner, LatencyModel.from_config(config), config.effective_max_inflight)
