"""Inference and weight loading in a process of their own, so the control loop's interpreter runs the tick alone.

Why: a thread shares the interpreter lock with the control thread. PyTorch releases the lock
inside a kernel but not between kernels, and a policy's forward is hundreds of Python-level
steps between kernels; the weights loader parses headers and walks tensors; a library call that
holds the lock for 100 ms (a big ``bytes`` copy, a tokenizer) stalls every thread of the process.
At 30 fps a tick has 33 ms, so anything that can hold the lock longer than a few ms must not share
it with the tick. In a child process the policy, its shadow copy and the weights loader hold
their own lock; the control process keeps the tick, the link's few short calls and the recorder.

The child builds the policy itself from a picklable ``factory`` (the commands pass
``load_policy`` with the configuration), so the model's memory exists once, where it runs. It
serves over one pipe, in messages of msgpack plus raw array bytes (never unpickled):

* ``predict``: an ``InferenceRequest`` (with the observations of the ticks before, for a policy that
  reads them); the answer is the chunk (or the error), the version that
  computed it, and whether new weights were swapped in right before it;
* ``weights``: a verified safetensors payload in a file under /dev/shm (the link's chunk
  assembler writes the download straight into it, see ``allocate_weights``), copied once into the
  child's shadow policy by ``load_weights_into`` and swapped in between two chunks; the child
  answers ``loaded`` (or ``weights_error``) and ``released``, after which the file holds a later
  download (``robot_rl.edge.weights_files``);
* ``prepare``: a learner link will send weights; the child builds its shadow now, at the loader's
  low priority, as the in-process streamer does at its start, so the first swap costs what later
  ones do (``ProcessPolicy.prepare_for_weights`` also has a download file faulted in);
* calls made before the robot moves: ``bind_joints``, a synchronous ``predict_chunk`` (the warm-up),
  ``save_pretrained``.

Swaps follow the rule a policy in the control process follows, from the same class
(``robot_rl.edge.swap.WeightSwap``): exactly two policy objects, the dropped one becomes the next
shadow, newer weights withdraw a swap not yet taken, and a swap only happens when no prediction
runs (``PolicyRunner``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import mmap
import multiprocessing as mp
import os
import queue
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from robot_rl.bridges.zmq.weights import HEADER_ROOM
from robot_rl.core.ctrl_c import ctrl_c_left_to_the_parent
from robot_rl.core.errors import ConfigError
from robot_rl.core.parent_watch import exit_when_parent_dies
from robot_rl.core.priority import lower_own_priority, lower_thread_priority
from robot_rl.core.types import ActionChunk
from robot_rl.edge.inference import InferenceRequest, InferenceResult, PolicyRunner, PolicySwap
from robot_rl.edge.swap import WeightSwap
from robot_rl.edge.weight_loading import load_weights_into
from robot_rl.edge.weights_files import PREFIX, SHM_DIR, WeightsFilePool
from robot_rl.policies.base import ChunkPolicy, ObservationHistory, PastObservation
from robot_rl.policies.trainable import published_state

log = logging.getLogger(__name__)

PolicyFactory = Callable[[], ChunkPolicy]  # picklable: a module-level function or a functools.partial of one
INFERENCE_NICE = 5  # the child yields the CPU to the control process whenever both want it
LOADER_NICE = 10  # and within the child, the weights loader yields to inference
START_TIMEOUT_S = 600.0  # building a VLA from a checkpoint (weights from disk, tokenizer) takes a while
CALL_TIMEOUT_S = 120.0  # a synchronous call before the robot moves (a cold first inference included)
_WEIGHTS_NEWS = ("loaded", "weights_error", "released")  # sent by the child's loader whenever a load ends


class PolicyProcessError(RuntimeError):
    """The policy process could not start, died, or refused a call."""


# ---------------------------------------------------------------- the pipe's messages


def _pack(kind: str, body: Mapping[str, Any] | None = None, arrays: Mapping[str, np.ndarray | None] | None = None
          ) -> bytes:
    packed = {name: [a.dtype.str, list(a.shape), np.ascontiguousarray(a).tobytes()]
              for name, a in (arrays or {}).items() if a is not None}
    return msgpack.packb({"kind": kind, "body": dict(body or {}), "arrays": packed}, use_bin_type=True)


def _unpack(data: bytes) -> tuple[str, dict[str, Any], dict[str, np.ndarray]]:
    msg = msgpack.unpackb(data, raw=False)
    # Copied out of the message (a few kB to a few MB): policies may write to their inputs.
    arrays = {name: np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape).copy()
              for name, (dtype, shape, raw) in msg["arrays"].items()}
    return msg["kind"], msg["body"], arrays


def _request_message(request: InferenceRequest) -> bytes:
    body = {"chunk_id": request.chunk_id, "instruction": request.instruction, "delay": request.delay_estimate}
    return _pack("predict", body | _observation_body(request.images, request.history),
                 {**_observation_arrays(request.images, request.state, request.history), "prefix": request.prefix})


def _observation_body(images: Mapping[str, np.ndarray], history: tuple[PastObservation, ...]) -> dict[str, Any]:
    return {"cameras": list(images), "past": [list(past.images) for past in history]}


def _observation_arrays(images: Mapping[str, np.ndarray], state: np.ndarray,
                        history: tuple[PastObservation, ...]) -> dict[str, np.ndarray]:
    """The request's images and state, and those of the ticks before it under ``past/<i>/``."""
    arrays = {f"image/{cam}": image for cam, image in images.items()}
    arrays["state"] = np.asarray(state, dtype=np.float32)
    for i, past in enumerate(history):
        arrays.update({f"past/{i}/image/{cam}": image for cam, image in past.images.items()})
        arrays[f"past/{i}/state"] = np.asarray(past.state, dtype=np.float32)
    return arrays


def _observation(body: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {cam: arrays[f"image/{cam}"] for cam in body["cameras"]}


def _history(body: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> tuple[PastObservation, ...]:
    return tuple(PastObservation({cam: arrays[f"past/{i}/image/{cam}"] for cam in cameras}, arrays[f"past/{i}/state"])
                 for i, cameras in enumerate(body.get("past", [])))


# ---------------------------------------------------------------- the child process


class _PolicyServer:
    """The child's side: a reader (this process's main thread), inference threads, one loader thread."""

    def __init__(self, policy: ChunkPolicy, conn: Any, version: int) -> None:
        self.conn = conn
        self.policy = policy  # what synchronous calls use; the runner's from then on
        self.version = version
        self.runner: PolicyRunner | None = None  # made with the robot's joint count (``workers``)
        self._send_lock = threading.Lock()
        # Its shadow is allocated on "prepare" (a learner link started) or with the first weights, so a
        # run without a learner never pays for it.
        self.swaps = WeightSwap(policy, version)
        self._requests: queue.SimpleQueue[tuple[dict, dict] | None] = queue.SimpleQueue()
        self._weights: queue.Queue[tuple[int, str, int]] = queue.Queue()
        self._threads: list[threading.Thread] = []

    def send(self, kind: str, body: Mapping[str, Any] | None = None, arrays: Mapping[str, Any] | None = None) -> None:
        data = _pack(kind, body, arrays)
        with self._send_lock:
            self.conn.send_bytes(data)

    def serve(self) -> None:
        loader = threading.Thread(target=self._load_loop, name="policy-weights", daemon=True)
        loader.start()
        lower_thread_priority(loader, LOADER_NICE)
        while True:
            try:
                kind, body, arrays = _unpack(self.conn.recv_bytes())
            except (EOFError, OSError):
                return  # the control process is gone: nothing left to serve
            if kind == "close":
                return
            if kind == "workers":
                self._start_workers(int(body["n"]), int(body["action_dim"]))
            elif kind == "predict":
                self._requests.put((body, arrays))
            elif kind == "weights":
                self._weights.put((int(body["version"]), str(body["path"]), int(body["size"])))
            elif kind == "prepare":
                threading.Thread(target=self._prepare_shadow, args=(LOADER_NICE,), name="policy-shadow",
                                 daemon=True).start()
            else:
                self._call(kind, body, arrays)

    def _start_workers(self, n: int, action_dim: int) -> None:
        if self.runner is None:
            self.runner = PolicyRunner(self.policy, self.version, action_dim)
        while len(self._threads) < n:
            thread = threading.Thread(target=self._predict_loop, name=f"policy-{len(self._threads)}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _call(self, kind: str, body: dict, arrays: dict) -> None:
        """A synchronous call from before the robot moves; answered with ``reply`` or ``error``."""
        policy: Any = self.policy if self.runner is None else self.runner.policy
        try:
            if kind == "bind_joints":
                bind = getattr(policy, "bind_joints", None)
                if bind is not None:
                    bind(tuple(body["names"]))
                self.send("reply")
            elif kind == "predict_chunk":
                observation, state = _observation(body, arrays), arrays["state"]
                history = _history(body, arrays)
                if "prefix" in arrays:
                    chunk = policy.predict_chunk_guided(observation, state, body["instruction"], arrays["prefix"],
                                                        int(body["delay"]))
                elif history:
                    chunk = policy.predict_chunk_with_history(history, observation, state, body["instruction"])
                else:
                    chunk = policy.predict_chunk(observation, state, body["instruction"])
                self.send("reply", arrays={"chunk": np.asarray(chunk, dtype=np.float32)})
            elif kind == "save_pretrained":
                policy.save_pretrained(body["directory"])
                self.send("reply")
            else:
                self.send("error", {"error": f"unknown call {kind!r}"})
        except Exception as exc:  # noqa: BLE001 - reported to the caller, which raises it there
            self.send("error", {"error": f"{type(exc).__name__}: {exc}"})

    def _predict_loop(self) -> None:
        assert self.runner is not None  # made before any worker thread starts
        while (item := self._requests.get()) is not None:
            body, arrays = item
            swap = self.swaps.take(on_take=self.runner.announce_swap)  # later requests wait for this swap
            request = InferenceRequest(
                chunk_id=int(body["chunk_id"]), request_tick=0, request_time_s=0.0,
                images=_observation(body, arrays), state=arrays["state"], instruction=body["instruction"],
                executed_index=-1, delay_ticks=0, delay_estimate=int(body["delay"]), start_tick=None,
                rolled_state=None, generation=0, swap=swap, prefix=arrays.get("prefix"),
                history=_history(body, arrays))
            result = self.runner.run(request)
            if swap is not None:
                self.swaps.settle(swap, result.swap_error)
            chunk = None if result.chunk is None else result.chunk.actions
            self.send("result", {"chunk_id": request.chunk_id, "version": result.policy_version,
                                 "compute_s": result.compute_s, "error": result.error,
                                 "swapped": swap is not None, "swap_error": result.swap_error},
                      {"chunk": chunk})

    def _load_loop(self) -> None:
        while self.runner is None:  # weights come only once the edge node runs the policy
            time.sleep(0.01)
        while True:
            version, path, size = self._weights.get()
            while not self._weights.empty():  # newer weights win; the older files are dropped unread
                self.send("released", {"path": path})
                version, path, size = self._weights.get()
            try:
                shadow = self._free_shadow()
                with open(path, "rb") as file:
                    # A private copy-on-write view: writable (torch.frombuffer wants that), never written.
                    # Not closed here: an error's traceback may still hold a view of it; the last
                    # reference unmaps it.
                    view = mmap.mmap(file.fileno(), size, access=mmap.ACCESS_COPY) if size else bytearray()
                load_weights_into(shadow, memoryview(view))
                del view
            except Exception as exc:  # noqa: BLE001 - the running weights stay; the control process is told
                self.send("weights_error", {"version": version, "error": f"{type(exc).__name__}: {exc}"})
                continue
            finally:
                self.send("released", {"path": path})  # the control process reuses or removes the file
            self.swaps.offer(PolicySwap(version=version, policy=shadow))
            self.send("loaded", {"version": version, "bytes": size, "wall_s": time.time()})

    def _prepare_shadow(self, nice: int) -> None:
        """Allocate the shadow now, at the loader's priority (a learner link started)."""
        lower_own_priority(nice)
        self.swaps.prepare()

    def _free_shadow(self) -> Any:
        """The shadow, once nothing else can read it (an inference thread swapping it in is waited out)."""
        while (shadow := self.swaps.free_shadow()) is None:
            time.sleep(0.002)
        return shadow


def _child_main(factory: PolicyFactory, conn: Any, version: int) -> None:
    exit_when_parent_dies("the policy process")  # an edge killed with SIGKILL leaves no model (nor GPU memory)
    with contextlib.suppress(OSError):
        os.nice(INFERENCE_NICE)
    try:
        policy = factory()
    except Exception as exc:  # noqa: BLE001 - sent to the parent, which raises it with this text
        kind = "config" if isinstance(exc, ConfigError) else "missing" if isinstance(exc, FileNotFoundError) else ""
        conn.send_bytes(_pack("failed", {"error": f"{type(exc).__name__}: {exc}", "message": str(exc), "kind": kind}))
        return
    action_dim = getattr(policy, "action_dim", None)  # a policy without joints of its own (hold) has none
    history = getattr(policy, "observation_history", ObservationHistory())
    info = {"action_dim": None if action_dim is None else int(action_dim), "chunk_size": int(policy.chunk_size),
            "cameras": list(getattr(policy, "cameras", ())), "guided": hasattr(policy, "predict_chunk_guided"),
            "config_hash": policy.config_hash() if hasattr(policy, "config_hash") else "",
            "swappable": hasattr(policy, "parameters"), "name": type(policy).__name__,
            "published_bytes": _published_bytes(policy),
            "history": [history.steps, history.past_actions]}
    server = _PolicyServer(policy, conn, version)
    server.send("ready", info)
    server.serve()


def _published_bytes(policy: Any) -> int:
    """Bytes of the tensors a learner publishes for ``policy`` (0: it takes no weights)."""
    if not hasattr(policy, "parameters"):
        return 0
    return sum(t.numel() * t.element_size() for t in published_state(policy).values())


# ---------------------------------------------------------------- the control process's side


class ProcessPolicy:
    """The policy a child process runs, as the control process sees it.

    Read its description (``action_dim``, ``chunk_size``, ``cameras``, ``config_hash()``), call
    it synchronously before the robot moves (``bind_joints``, ``predict_chunk``), and let the edge
    node run it through ``runner``. Build it with ``spawn_policy``.
    """

    def __init__(self, process: Any, conn: Any, info: Mapping[str, Any], version: int) -> None:
        self._process = process
        self._conn = conn
        self._info = dict(info)
        self.version = version
        self._send_lock = threading.Lock()
        self._weights_files = WeightsFilePool()  # where downloads are assembled, reused between versions
        self._closed = False
        self._runner: ProcessRunner | None = None

    @property
    def action_dim(self) -> int:
        if self._info["action_dim"] is None:  # as for the policy itself: getattr(policy, "action_dim", default)
            raise AttributeError(f"{self._info['name']} has no action_dim of its own")
        return int(self._info["action_dim"])

    @property
    def chunk_size(self) -> int:
        return int(self._info["chunk_size"])

    @property
    def cameras(self) -> tuple[str, ...]:
        return tuple(self._info["cameras"])

    @property
    def observation_history(self) -> ObservationHistory:
        return ObservationHistory(*self._info["history"])

    @property
    def swappable(self) -> bool:
        """True where the child's policy has weights that can be swapped (a torch module)."""
        return bool(self._info["swappable"])

    def config_hash(self) -> str:
        return str(self._info["config_hash"])

    def __repr__(self) -> str:
        return f"ProcessPolicy({self._info['name']}, pid {self._process.pid})"

    # ------------------------------------------------------------ before the robot moves

    def bind_joints(self, names: tuple[str, ...] | list[str]) -> None:
        self._call("bind_joints", {"names": list(names)})

    def predict_chunk(self, observation: dict[str, np.ndarray], state: np.ndarray, instruction: str) -> np.ndarray:
        return self._predict_now(observation, state, instruction, None, 0)

    def predict_chunk_with_history(self, history: Sequence[PastObservation], observation: dict[str, np.ndarray],
                                   state: np.ndarray, instruction: str) -> np.ndarray:
        return self._predict_now(observation, state, instruction, None, 0, tuple(history))

    def save_pretrained(self, directory: str | Path) -> None:
        self._call("save_pretrained", {"directory": str(directory)})

    def _predict_now(self, observation: dict[str, np.ndarray], state: np.ndarray, instruction: str,
                     prefix: np.ndarray | None, delay: int, history: tuple[PastObservation, ...] = ()) -> np.ndarray:
        body = {"instruction": instruction, "delay": int(delay)} | _observation_body(observation, history)
        _, reply = self._call("predict_chunk", body, {**_observation_arrays(observation, state, history),
                                                      "prefix": prefix})
        return reply["chunk"]

    def _call(self, kind: str, body: Mapping[str, Any], arrays: Mapping[str, Any] | None = None
              ) -> tuple[dict, dict[str, np.ndarray]]:
        if self._runner is not None and self._runner.in_flight:
            raise PolicyProcessError(f"{kind}: the policy process is serving the edge node; call it before")
        self.send(_pack(kind, body, arrays))
        while True:
            if not self._conn.poll(CALL_TIMEOUT_S):
                raise PolicyProcessError(f"the policy process did not answer {kind!r} within {CALL_TIMEOUT_S:.0f} s")
            reply_kind, reply, reply_arrays = self.receive()
            if reply_kind not in _WEIGHTS_NEWS:
                break
            if self._runner is not None:  # news of a load that finished meanwhile: the runner's, not the reply
                self._runner.take(reply_kind, reply, reply_arrays)
        if reply_kind == "error":
            raise PolicyProcessError(f"the policy process refused {kind!r}: {reply['error']}")
        return reply, reply_arrays

    # ------------------------------------------------------------ the edge node's runner

    def runner(self, clock_now: Callable[[], float], action_dim: int, max_inflight: int = 1) -> ProcessRunner:
        """The ``InferenceWorker`` for an ``EdgeNode`` driving ``action_dim`` joints (one per policy process)."""
        if self._runner is None:
            self.send(_pack("workers", {"n": max_inflight, "action_dim": action_dim}))
            self._runner = ProcessRunner(self, clock_now, max_inflight)
        return self._runner

    # ------------------------------------------------------------ weights

    def prepare_for_weights(self) -> None:
        """A learner link starts: the child builds its shadow and a download file of the published
        size is faulted in, both in the background at low priority, so the first swap does not pay for
        fresh memory (~0.9 s per GB on this box) on top of the transfer."""
        if not self.swappable:
            return
        self.send(_pack("prepare"))
        self._weights_files.prepare(int(self._info.get("published_bytes", 0)) + HEADER_ROOM)

    def allocate_weights(self, size: int) -> memoryview:
        """A buffer for a download of ``size`` bytes, in a file the child maps (``stage_weights``
        then sends only its name: no copy between the processes); the file the child released last
        when one of that size is free (``robot_rl.edge.weights_files``)."""
        return self._weights_files.allocate(size)

    def stage_weights(self, version: int, data: bytes | bytearray | memoryview) -> None:
        """Hand verified weights to the child, which loads them into its shadow and swaps them in
        between two chunks. Never blocks on the load; ``loaded_at`` / ``weights_errors`` report it."""
        view = memoryview(data)
        path = self._weights_files.stage(view)
        if path is None:  # not a buffer of ours: written to a file once (the write releases the GIL)
            path = Path(tempfile.mkstemp(prefix=f"{PREFIX}{os.getpid()}-", dir=SHM_DIR)[1])
            path.write_bytes(view)
        # The child answers "released" once it is done with the file: then it is reused or removed.
        self.send(_pack("weights", {"version": int(version), "path": str(path), "size": view.nbytes}))

    def release_weights_file(self, path: str) -> None:
        self._weights_files.release(path)

    # ------------------------------------------------------------ plumbing

    def send(self, data: bytes) -> None:
        if self._closed:
            raise PolicyProcessError("the policy process is closed")
        try:
            with self._send_lock:
                self._conn.send_bytes(data)
        except (BrokenPipeError, OSError) as exc:
            raise PolicyProcessError(f"the policy process (pid {self._process.pid}) is gone: {exc}") from exc

    def has_message(self) -> bool:
        """True when the child's next message can be read without waiting (or it is gone: then ``receive`` says so)."""
        return bool(self._conn.poll(0))

    def receive(self) -> tuple[str, dict, dict[str, np.ndarray]]:
        try:
            return _unpack(self._conn.recv_bytes())
        except (EOFError, OSError) as exc:
            raise PolicyProcessError(f"the policy process (pid {self._process.pid}) is gone "
                                     f"(exit code {self._process.exitcode})") from exc

    def close(self, timeout_s: float = 5.0) -> None:
        if self._closed:
            return
        with contextlib.suppress(PolicyProcessError):
            self.send(_pack("close"))
        self._closed = True
        self._process.join(timeout_s)
        if self._process.is_alive():
            log.warning("policy process %d still busy after %.0f s; terminating it", self._process.pid, timeout_s)
            self._process.terminate()
            self._process.join(timeout_s)
        self._conn.close()
        self._weights_files.close()


class GuidedProcessPolicy(ProcessPolicy):
    """A ``ProcessPolicy`` whose child policy takes a frozen prefix (real-time chunking)."""

    def predict_chunk_guided(self, observation: dict[str, np.ndarray], state: np.ndarray, instruction: str,
                             prefix: np.ndarray, delay: int) -> np.ndarray:
        return self._predict_now(observation, state, instruction, np.asarray(prefix, dtype=np.float32), delay)


def spawn_policy(factory: PolicyFactory, version: int = 0, start_timeout_s: float = START_TIMEOUT_S
                 ) -> ProcessPolicy:
    """Start a process that builds ``factory()`` and serves it; wait until it is ready.

    Raises ``PolicyProcessError`` with the child's own message if building the policy fails.
    """
    ctx = mp.get_context("spawn")  # a fresh interpreter: no copy of this process's threads or CUDA state
    parent, child = ctx.Pipe(duplex=True)
    process = ctx.Process(target=_child_main, args=(factory, child, version), name="policy", daemon=True)
    with ctrl_c_left_to_the_parent():
        process.start()
    child.close()
    if not parent.poll(start_timeout_s):
        process.terminate()
        raise PolicyProcessError(f"the policy process did not start within {start_timeout_s:.0f} s")
    try:
        kind, body, _ = _unpack(parent.recv_bytes())
    except (EOFError, OSError) as exc:
        process.join(5)
        raise PolicyProcessError(f"the policy process died while starting (exit code {process.exitcode})") from exc
    if kind != "ready":
        process.join(5)
        # A wrong setting or a missing checkpoint stays what it was, so the CLI reports it in one line.
        if body.get("kind") == "config":
            raise ConfigError(body["message"])
        if body.get("kind") == "missing":
            raise FileNotFoundError(body["message"])
        raise PolicyProcessError(f"the policy could not be built in its process: {body.get('error', kind)}")
    cls = GuidedProcessPolicy if body["guided"] else ProcessPolicy
    return cls(process, parent, body, version)


class ProcessRunner:
    """``InferenceWorker`` of a ``ProcessPolicy``: ``submit`` writes the request to the pipe,
    ``poll`` reads what the child answered; neither waits for the child."""

    def __init__(self, policy: ProcessPolicy, clock_now: Callable[[], float], max_inflight: int) -> None:
        self.policy = policy
        self.max_inflight = max_inflight
        self._now = clock_now
        self._requests: dict[int, InferenceRequest] = {}
        self._results: deque[InferenceResult] = deque()
        self.loaded_at: dict[int, float] = {}  # version -> wall time (time.time()) it was in the child's shadow
        self.weights_errors: list[tuple[int, str]] = []
        self.version = policy.version
        self.died: str | None = None  # why the policy process is gone; every request then fails at once

    @property
    def running_policy(self) -> ChunkPolicy:
        return self.policy

    @property
    def in_flight(self) -> int:
        return len(self._requests)

    @property
    def busy(self) -> bool:
        return bool(self._requests)

    def submit(self, request: InferenceRequest) -> None:
        if len(self._requests) >= self.max_inflight:
            raise RuntimeError(f"{len(self._requests)} inferences already in flight (max {self.max_inflight}); "
                               "poll first")
        if request.swap is not None:
            raise PolicyProcessError("a policy in its own process takes new weights through stage_weights, "
                                     "not through request_policy_swap")
        self._requests[request.chunk_id] = request
        if self.died is None:
            try:
                self.policy.send(_request_message(request))
            except PolicyProcessError as exc:
                self._lost(str(exc))
        else:
            self._fail_in_flight()

    def poll(self, now: float) -> InferenceResult | None:
        try:
            while not self._results and self.died is None and self.policy.has_message():
                self.take(*self.policy.receive())
        except PolicyProcessError as exc:
            self._lost(str(exc))
        return self._results.popleft() if self._results else None

    def _lost(self, reason: str) -> None:
        """The policy process is gone: no chunk will come. Each request in flight, and every later
        one, comes back as a refused chunk, so the node holds the arm (and counts it) instead of
        waiting forever or stopping mid-motion."""
        if self.died is None:
            log.error("%s: no more chunks; the arm holds its last target", reason)
            self.died = reason
        self._fail_in_flight()

    def _fail_in_flight(self) -> None:
        now = self._now()
        for request in self._requests.values():
            self._results.append(InferenceResult(request, None, self.version, 0.0, error=self.died,
                                                 ready_time_s=now, latency_s=now - request.request_time_s))
        self._requests.clear()

    def take(self, kind: str, body: dict, arrays: dict[str, np.ndarray]) -> None:
        """One message of the policy process: a chunk, or news of a weights load."""
        if kind == "loaded":
            self.loaded_at[int(body["version"])] = float(body["wall_s"])
        elif kind == "weights_error":
            self.weights_errors.append((int(body["version"]), str(body["error"])))
            log.error("weights v%d refused by the policy process: %s", body["version"], body["error"])
        elif kind == "released":
            self.policy.release_weights_file(str(body["path"]))
        elif kind == "result":
            self._results.append(self._result(body, arrays))
        else:
            log.error("unexpected %r from the policy process; ignored", kind)

    def _result(self, body: dict, arrays: dict[str, np.ndarray]) -> InferenceResult:
        request = self._requests.pop(int(body["chunk_id"]))
        version = int(body["version"])
        if body["swapped"]:  # the node counts a swap by the request that carried it
            request = dataclasses.replace(request, swap=PolicySwap(version=version))
        if body["swap_error"] is None:
            self.version = version
        chunk = None
        if "chunk" in arrays:
            chunk = ActionChunk(actions=arrays["chunk"], chunk_id=request.chunk_id, policy_version=version,
                                request_tick=request.request_tick, delay_ticks=request.delay_ticks,
                                rolled_state=request.rolled_state, inference_s=float(body["compute_s"]))
        ready = self._now()
        return InferenceResult(request, chunk, version, float(body["compute_s"]), error=body["error"],
                               swap_error=body["swap_error"], ready_time_s=ready,
                               latency_s=ready - request.request_time_s)

    def close(self) -> None:
        self._requests.clear()
        self.policy.close()
