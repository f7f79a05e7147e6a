"""Turn a Teleop device into the EdgeNode's ``intervention`` hook, plus event handling.

The node calls the hook once per tick with the observation; the hook returns the human's
joint target while a takeover is on, else None (the policy drives). Events from the
device (or pushed by the session's keyboard) switch takeovers on and off; the rest
(success, failure, rerecord, e-stop) are queued for the session loop to act on.

Takeover: the blender starts from the node's last commanded target (the follower's
current pose as far as the servos are concerned), so the command never jumps.
Hand-back: ``node.hand_back()`` flushes the action queue so the policy restarts from a
fresh chunk computed from the current state, not from a plan made before the takeover, and
eases its first actions under the blender's per-tick bound.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

import numpy as np

from robot_rl.hardware.robot import Observation
from robot_rl.hardware.teleop.base import Teleop, TeleopEvent
from robot_rl.hardware.teleop.blend import TakeoverBlender

log = logging.getLogger(__name__)

# After a hand-back the policy's commands are eased towards its plan for at most this long:
# at the blender's bound (3 deg/tick) that covers 180 degrees, any gap an arm can have.
HAND_BACK_EASE_S = 2.0


class HandBackTarget(Protocol):
    """What the hook needs from the edge node (EdgeNode satisfies it)."""

    @property
    def last_command(self) -> np.ndarray | None: ...

    def hand_back(self, ease_step: np.ndarray | float | None = None, ease_ticks: int = 0) -> None: ...


class TeleopIntervention:
    """``intervention`` hook for EdgeNode: ``hook(obs) -> action | None``."""

    def __init__(self, teleop: Teleop, blender: TakeoverBlender, node: HandBackTarget | None = None) -> None:
        self.teleop = teleop
        self.blender = blender
        self.node = node
        self.intervening = False
        self.takeovers = 0
        self._pushed: list[TeleopEvent] = []
        self._pending: list[TeleopEvent] = []  # for the session: success, failure, rerecord, estop
        self._lock = threading.Lock()  # push_event may come from a key-reader thread

    def bind(self, node: HandBackTarget) -> None:
        """Attach the node (it is created after the hook, which it takes as an argument)."""
        self.node = node

    def push_event(self, event: TeleopEvent) -> None:
        """An event from another source (the session's keyboard); handled at the next tick."""
        with self._lock:
            self._pushed.append(TeleopEvent(event))

    def drain_events(self) -> list[TeleopEvent]:
        """Episode-level events seen since the last call, oldest first."""
        with self._lock:
            events, self._pending = self._pending, []
        return events

    def reset(self) -> None:
        """New episode: the policy drives; forget unhandled episode events."""
        self.intervening = False
        self.blender.stop()
        with self._lock:
            self._pushed.clear()
            self._pending.clear()

    def begin_episode(self, episode: int) -> None:
        """New episode ``episode``: reset the hook and, if it keeps per-episode state, the device."""
        self.reset()
        reset_device = getattr(self.teleop, "reset_episode", None)
        if reset_device is not None:
            reset_device(episode)

    def __call__(self, observation: Observation) -> np.ndarray | None:
        reading = self.teleop.read(observation)
        with self._lock:
            events, self._pushed = self._pushed + list(reading.events), []
        for event in events:
            self._handle(event, observation)
        if not self.intervening:
            return None
        if reading.action is None:
            # Driving but the device has nothing this tick (e.g. a dropped read): hold.
            return self.blender(self._current_pose(observation))
        return self.blender(reading.action)

    # -- internals -----------------------------------------------------------------

    def _handle(self, event: TeleopEvent, observation: Observation) -> None:
        if event is TeleopEvent.TAKE_OVER:
            if not self.intervening:
                self.intervening = True
                self.takeovers += 1
                pose = self._current_pose(observation)
                self.blender.start(pose)
                start = getattr(self.teleop, "start_takeover", None)  # jog devices start from here
                if start is not None:
                    start(pose)
                log.info("operator takes over")
        elif event is TeleopEvent.HAND_BACK:
            if self.intervening:
                self._end_takeover()
                log.info("operator hands back to the policy")
        else:
            if event is TeleopEvent.ESTOP and self.intervening:
                self._end_takeover(hand_back=False)
            with self._lock:
                self._pending.append(event)

    def _end_takeover(self, hand_back: bool = True) -> None:
        self.intervening = False
        self.blender.stop()
        if hand_back and self.node is not None:
            # The policy's first actions after the hand-back are bounded as a takeover's are.
            self.node.hand_back(self.blender.max_step, round(HAND_BACK_EASE_S * self.blender.fps))

    def _current_pose(self, observation: Observation) -> np.ndarray:
        """Where the servos are being told to be now: the last command, else the measured state."""
        last = self.node.last_command if self.node is not None else None
        return np.asarray(observation["state"] if last is None else last, dtype=np.float32)
