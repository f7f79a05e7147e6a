"""Malformed and hostile messages for ``robot-rl bench faults``: what an attacker holding a valid key
of its own (or a broken client) can put on the learner's sockets.

Each class builds the frames of one message; ``fuzz_router`` sends them round-robin from
authenticated clients ("intruder-K"), interleaved with probes that a valid request is still answered
within ``PROBE_TIMEOUT_S`` (else a hang), and with impersonation attempts that must all be refused.
Rows marked ``POISON_ROBOT`` / ``INTRUDER_ROBOT`` in their state must never reach the store.

The learner ignores a sender (a CURVE key) for a cool-off once it has refused more than
``PeerLimits.max_refusals`` of its messages in a window: each intruder key sends fewer than that
(``messages_per_key``), so every message reaches the learner's checks, and ``ignored_after_garbage``
then shows one key sending past the bound being ignored (one log line, no more answers).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import zmq

from robot_rl.bridges.zmq.protocol import (
    Error,
    Heartbeat,
    Hello,
    HelloOk,
    WeightsChunk,
    WeightsFetch,
    decode_message,
    encode_message,
)
from robot_rl.bridges.zmq.segments import ImageEncoding, encode_segment
from robot_rl.core.types import Step

POISON_ROBOT = 98.0  # state[0] of steps the fuzzer sends with bad values
INTRUDER_ROBOT = 99.0  # state[0] of steps the fuzzer sends as another robot
PROBE_EVERY = 250  # malformed messages between two "is it still answering" probes
PROBE_TIMEOUT_S = 5.0


def marked_steps(marker: float, n: int = 4, image: int = 96, cameras: tuple[str, ...] = ("front",)) -> list[Step]:
    frame = np.full((image, image, 3), 80, np.uint8)
    return [Step(tick=t, time_s=t / 30, state=np.array([marker, 0, t, 0, 0, 0], np.float32),
                 action=np.zeros(6, np.float32), images={c: frame for c in cameras}) for t in range(n)]


def _frames(msg: Any) -> list[bytes]:
    return [bytes(f) for f in encode_message(msg)]


def _envelope_edit(frames: list[bytes], edit: Callable[[dict], None]) -> list[bytes]:
    envelope = msgpack.unpackb(frames[0], raw=False)
    edit(envelope)
    return [msgpack.packb(envelope, use_bin_type=True), *frames[1:]]


MakeFrames = Callable[[np.random.Generator, int], list[bytes]]


def malformed_classes(robot_id: str, image: int, cameras: tuple[str, ...]) -> dict[str, MakeFrames]:
    """name -> make(rng, i): the frames of one malformed message of that class."""
    segment = encode_segment(robot_id, 10**6, 0, marked_steps(POISON_ROBOT, image=image, cameras=cameras),
                             image_encoding=ImageEncoding("jpeg"))
    valid = _frames(segment)

    def poisoned(change: Callable[[Step], Step]) -> MakeFrames:
        def make(rng: np.random.Generator, i: int) -> list[bytes]:
            steps = [change(s) for s in marked_steps(POISON_ROBOT, image=image, cameras=cameras)]
            return _frames(encode_segment(robot_id, 2 * 10**6 + i, 0, steps, image_encoding=ImageEncoding("raw")))
        return make

    def nan_reward(s: Step) -> Step:
        s.reward = math.nan
        return s

    def nan_state(s: Step) -> Step:
        s.state = s.state.copy()
        s.state[3] = math.inf
        return s

    def huge_tick(s: Step) -> Step:
        s.tick = 2**40 + s.tick
        return s

    def nan_policy_action(s: Step) -> Step:
        s.policy_action = np.full(6, math.nan, np.float32)
        return s

    def wrong_joints(s: Step) -> Step:
        s.state, s.action = np.zeros(7, np.float32), np.zeros(7, np.float32)
        return s

    def big_image(s: Step) -> Step:
        s.images = {c: np.zeros((4 * image, 4 * image, 3), np.uint8) for c in cameras}
        return s

    def set_shape(shape: list[int]) -> Callable[[dict], None]:
        return lambda env: env["arrays"][0].__setitem__("shape", shape)

    return {
        "random_bytes": lambda rng, i: [rng.bytes(int(rng.integers(1, 200)))],
        "random_frames": lambda rng, i: [rng.bytes(int(rng.integers(1, 64))) for _ in range(int(rng.integers(2, 5)))],
        "truncated_envelope": lambda rng, i: [valid[0][: int(rng.integers(1, len(valid[0])))], *valid[1:]],
        "wrong_field_types": lambda rng, i: _envelope_edit(valid, lambda env: env["body"].__setitem__("seq", "x")),
        "wrong_protocol_version": lambda rng, i: _envelope_edit(valid, lambda env: env.__setitem__("v", 999)),
        "unknown_type": lambda rng, i: _envelope_edit(valid, lambda env: env.__setitem__("type", "launch")),
        "huge_declared_shape": lambda rng, i: _envelope_edit(valid, set_shape([2**40, 2**40])),
        "unbuildable_shape": lambda rng, i: _envelope_edit(valid, set_shape([0, 2**63])),
        "missing_frames": lambda rng, i: valid[:-1],
        "extra_frames": lambda rng, i: [*valid, b"extra"],
        "nan_reward": poisoned(nan_reward),
        "inf_state": poisoned(nan_state),
        "extreme_tick": poisoned(huge_tick),
        "nan_optional_array": poisoned(nan_policy_action),
        "wrong_joint_count": poisoned(wrong_joints),
        "oversized_images": poisoned(big_image),
        "garbage_jpeg": lambda rng, i: valid[:-1] + [rng.bytes(len(valid[-1]))],
        "wrong_direction": lambda rng, i: _frames(HelloOk(server_id="x", config_hash="", latest_version=1,
                                                           heartbeat_interval_s=1.0, max_message_bytes=10)),
        "weights_chunk_to_learner": lambda rng, i: _frames(WeightsChunk(version=1, chunk=0, sha256="",
                                                                         data=np.zeros(16, np.uint8))),
        "random_weights_fetch": lambda rng, i: _frames(WeightsFetch(version=int(rng.integers(-5, 10**9)),
                                                                     chunk=int(rng.integers(0, 10**6)))),
        "hello_flood": lambda rng, i: _frames(Hello(robot_id=f"flood-{i}", config_hash="", policy_version=-1)),
    }


class RouterFuzzer:
    """An authenticated DEALER that says hello as itself, then sends malformed messages."""

    def __init__(self, ctx: zmq.Context, endpoint: str, apply_curve: Callable[[zmq.Socket], None], robot_id: str,
                 config_hash: str, routing_id: bytes | None = None) -> None:
        self.robot_id = robot_id
        self.config_hash = config_hash
        self.socket = ctx.socket(zmq.DEALER)
        self.socket.linger = 0
        if routing_id is not None:
            self.socket.setsockopt(zmq.ROUTING_ID, routing_id)
        apply_curve(self.socket)
        self.socket.connect(endpoint)

    def request(self, frames: list[bytes], timeout_s: float = PROBE_TIMEOUT_S) -> Any | None:
        """Send; its reply within ``timeout_s`` (decoded), or None. The learner answers a connection
        in order, so errors still coming back for messages sent before it are skipped: taken for the
        answer, they would end the fuzzing while its last messages sat unsent in the socket's queue
        (and closing it with linger 0 drops them)."""
        sent = decode_message(frames).TYPE
        self.drain()
        self.socket.send_multipart(frames)
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0 and self.socket.poll(max(1, int(left * 1000))):
            reply = decode_message(self.socket.recv_multipart())
            if not isinstance(reply, Error) or reply.in_reply_to == sent:
                return reply
        return None

    def drain(self) -> None:
        while self.socket.poll(0):
            self.socket.recv_multipart()

    def close(self) -> None:
        self.socket.close(0)


def hello(fuzzer: RouterFuzzer, robot_id: str | None = None) -> Any | None:
    return fuzzer.request(_frames(Hello(robot_id=robot_id or fuzzer.robot_id, config_hash=fuzzer.config_hash,
                                        policy_version=-1)))


def probe(fuzzer: RouterFuzzer) -> bool:
    """A valid heartbeat is answered (after a hello, which the fuzzing may have made the learner forget)."""
    reply = fuzzer.request(_frames(Heartbeat(sender=fuzzer.robot_id, policy_version=-1, time_s=0.0, stats={})))
    if reply is not None and reply.TYPE == "error":
        reply = hello(fuzzer)
    return reply is not None


def intruder_name(k: int) -> str:
    return f"intruder-{k}"


def intruder_keys(messages: int, messages_per_key: int) -> int:
    """How many intruder keys the fuzzing of ``messages`` takes (the impersonation rounds reuse them)."""
    return max(1, -(-messages // messages_per_key))


def fuzz_router(connect: Callable[[int], RouterFuzzer], messages: int, messages_per_key: int, image: int,
                cameras: tuple[str, ...], seed: int, alive: Callable[[], bool]) -> dict[str, Any]:
    """Send ``messages`` malformed messages round-robin over the classes, ``messages_per_key`` from each
    intruder key (``connect(k)``: a client holding key k, not yet said hello); count hangs and crashes."""
    rng = np.random.default_rng(seed)
    names: list[str] = []
    sent: Counter[str] = Counter()
    hangs = crashes = 0
    started = time.monotonic()
    fuzzer: RouterFuzzer | None = None
    try:
        for i in range(messages):
            if i % messages_per_key == 0:
                if fuzzer is not None:
                    fuzzer.close()
                fuzzer = connect(i // messages_per_key)
                answer = hello(fuzzer)
                if answer is None or answer.TYPE != "hello_ok":  # without a session all stops at "hello first"
                    raise RuntimeError(f"bench faults: {fuzzer.robot_id}'s own hello was not accepted ({answer})")
                classes = malformed_classes(fuzzer.robot_id, image, cameras)
                names = sorted(classes)
            assert fuzzer is not None
            name = names[i % len(names)]
            fuzzer.socket.send_multipart(classes[name](rng, i))
            sent[name] += 1
            if (i + 1) % PROBE_EVERY == 0:
                fuzzer.drain()
                if not alive():
                    crashes += 1
                    break
                hangs += int(not probe(fuzzer))
        if fuzzer is not None:
            fuzzer.drain()
            if alive() and not probe(fuzzer):
                hangs += 1
    finally:
        if fuzzer is not None:
            fuzzer.close()
    return {"messages": int(sum(sent.values())), "classes": len(names), "by_class": dict(sent),
            "keys": intruder_keys(messages, messages_per_key), "crashes": crashes + int(not alive()),
            "hangs": hangs, "seconds": round(time.monotonic() - started, 1)}


def ignored_after_garbage(fuzzer: RouterFuzzer, max_refusals: int, log_path: Path) -> bool:
    """A key that goes on sending garbage past ``max_refusals`` is ignored: the learner says so in one
    log line, answers none of its messages (a valid heartbeat included), and says nothing more of it."""
    said = f"ignoring robot {fuzzer.robot_id!r}"
    answer = hello(fuzzer)
    if answer is None or answer.TYPE != "hello_ok":
        return False
    for _ in range(max_refusals + 1):  # each refused, the last one past the bound
        fuzzer.socket.send_multipart([b"\x00garbage"])
        if fuzzer.socket.poll(int(PROBE_TIMEOUT_S * 1000)):
            fuzzer.socket.recv_multipart()
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    while said not in log_path.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    for _ in range(max_refusals):
        fuzzer.socket.send_multipart([b"\x00garbage"])
    unanswered = fuzzer.request(_frames(Heartbeat(sender=fuzzer.robot_id, policy_version=-1, time_s=0.0,
                                                  stats={})), timeout_s=2.0) is None
    return unanswered and log_path.read_text().count(said) == 1


def impersonation_attempts(ctx: zmq.Context, endpoint: str, curve_of: Callable[[int], Callable[[zmq.Socket], None]],
                           keys: int, victim: str, image: int, cameras: tuple[str, ...],
                           tries: int, config_hash: str) -> dict[str, int]:
    """Clients with valid keys of their own (round-robin over ``keys`` intruder keys, ``curve_of(k)``) try
    to speak as ``victim``: each try must be refused. Returns attempts and how many got an ack or a
    hello_ok (admitted)."""
    steps = marked_steps(INTRUDER_ROBOT, image=image, cameras=cameras)
    admitted = attempts = 0
    for i in range(tries):
        # 1. hello as the victim; 2. a segment labelled as the victim on its own session; 3. a guessed
        # routing id in the client's format (the real one ends in 128 random bits).
        intruder, apply_curve = intruder_name(i % keys), curve_of(i % keys)
        own = RouterFuzzer(ctx, endpoint, apply_curve, intruder, config_hash)
        guessed = RouterFuzzer(ctx, endpoint, apply_curve, intruder, config_hash,
                               routing_id=f"{victim}/{i:032x}".encode())
        try:
            replies = [hello(own, victim)]
            hello(own)
            segment = encode_segment(victim, 3 * 10**6 + i, 0, steps, image_encoding=ImageEncoding("jpeg"))
            replies.append(own.request(_frames(segment)))
            replies.append(guessed.request(_frames(segment)))
        finally:
            own.close()
            guessed.close()
        attempts += len(replies)
        admitted += sum(r is not None and r.TYPE in ("ack", "hello_ok") for r in replies)
    return {"attempts": attempts, "admitted": admitted}
