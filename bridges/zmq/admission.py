"""Admission: what one sender may cost the learner (``PeerLimits``), checked before its message is read.

A sender is a CURVE key (one per robot), or without CURVE one connection (its routing id). Each has a
token bucket (its message rate) and a count of refused messages; past ``max_refusals`` within a window
it is ignored for a cool-off: its messages are dropped unread, its sessions forgotten (by the server),
with one log line. What is remembered per sender is bounded (``TRACKED_SENDERS``) and forgotten once
there is nothing to remember.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

# Senders whose rate and refusals are remembered; past it the least recently heard is forgotten. With
# CURVE a sender is a robot's key (a few dozen); without, a connection, which a client can renew anyway.
TRACKED_SENDERS = 4096


@dataclass
class PeerLimits:
    """What one sender may cost the learner, so that a broken or hostile client gets bounded work,
    memory and log lines and never crowds out the robots. A sender is a CURVE key (one per robot),
    or without CURVE one connection (its routing id).

    Sized far above what robots do: a robot at 30 fps with segments of a few steps sends 10-40
    messages a second (segments and a heartbeat); draining its spool after an outage (at most
    ``max_in_flight`` segments unacked) or downloading weights (``weights_window`` chunk requests
    unacked, 1 MB answered to each) a few hundred. A message over the rate is dropped unread: the
    edge re-sends a segment after its ack timeout and re-asks a chunk after its chunk timeout.
    """

    max_messages_per_s: float = 2000.0  # per sender, sustained
    burst_messages: int = 4000  # per sender at once: every chunk request of a 4 GB weights download
    # Refused messages (malformed, failing the checks, another robot's name, a refused hello) within
    # refusal_window_s; one more and the sender is ignored for cooloff_s: its sessions are forgotten and
    # its messages dropped unread, with one log line. A misconfigured robot's own retries cost it 1-4 a
    # second (its in-flight segments once per ack timeout, a hello every refused_retry_s).
    max_refusals: int = 100
    refusal_window_s: float = 10.0
    cooloff_s: float = 60.0
    # Sessions (accepted hellos) of one robot id: an edge restarted within peer_timeout_s leaves its old
    # session behind, so a new hello replaces the robot's oldest instead of being refused.
    max_sessions_per_robot: int = 4
    max_sessions: int = 1024  # in all; a hello from another robot past it is refused until one is forgotten
    # Messages libzmq queues per connection before the learner reads them (RCVHWM); past it the learner
    # stops reading that connection (TCP pushes back). A robot has ~30 outstanding at most.
    max_queued_messages: int = 256

    def __post_init__(self) -> None:
        if self.max_messages_per_s <= 0 or self.burst_messages < 1 or self.max_refusals < 0:
            raise ValueError(f"PeerLimits: max_messages_per_s > 0, burst_messages >= 1, max_refusals >= 0; got {self}")
        if self.max_sessions_per_robot < 1 or self.max_sessions < 1 or self.max_queued_messages < 1:
            raise ValueError(f"PeerLimits: max_sessions_per_robot, max_sessions and max_queued_messages must be >= 1, "
                             f"got {self}")
        if self.refusal_window_s <= 0 or self.cooloff_s < 0:
            raise ValueError(f"PeerLimits: refusal_window_s > 0 and cooloff_s >= 0, got {self}")


@dataclass
class _SenderState:
    """One sender's token bucket and refused messages (``PeerLimits``)."""

    tokens: float
    last_s: float
    refusals: int = 0
    window_start_s: float = 0.0
    ignored_until_s: float = 0.0
    over_rate: int = 0  # messages dropped for the rate since the last log line about it
    over_rate_logged_s: float = -1e9


class Admission:
    """The per-sender limits of one server; used on its serving thread only."""

    def __init__(self, limits: PeerLimits, counters: collections.Counter[str]) -> None:
        self.limits = limits
        self.counters = counters  # the server's: messages_ignored, messages_over_rate, senders_ignored
        self._senders: collections.OrderedDict[bytes, _SenderState] = collections.OrderedDict()
        self._last_prune_s = 0.0

    def admit(self, sender: bytes, now: float, name: Callable[[], str]) -> bool:
        """Whether to read this sender's message: not while it is ignored, nor over its rate (token bucket)."""
        limits = self.limits
        state = self._senders.get(sender)
        if state is None:
            state = self._senders[sender] = _SenderState(tokens=float(limits.burst_messages), last_s=now)
            if len(self._senders) > TRACKED_SENDERS:
                self._senders.popitem(last=False)
        else:
            self._senders.move_to_end(sender)
        if now < state.ignored_until_s:
            self.counters["messages_ignored"] += 1
            return False
        refill = (now - state.last_s) * limits.max_messages_per_s
        state.tokens = min(float(limits.burst_messages), state.tokens + refill)
        state.last_s = now
        if state.tokens >= 1.0:
            state.tokens -= 1.0
            return True
        self.counters["messages_over_rate"] += 1
        state.over_rate += 1
        if now - state.over_rate_logged_s >= limits.refusal_window_s:  # one line per window, not one per message
            log.warning("%s sends more than %g messages/s: %d dropped unread since the last such line",
                        name(), limits.max_messages_per_s, state.over_rate)
            state.over_rate, state.over_rate_logged_s = 0, now
        return False

    def refused(self, sender: bytes, now: float, name: Callable[[], str]) -> bool:
        """Count a refused message against its sender; past ``max_refusals`` in a window it is ignored
        for ``cooloff_s`` (said once), and True is returned: the caller forgets its sessions."""
        limits = self.limits
        state = self._senders.get(sender)
        if state is None:
            return False
        if now - state.window_start_s > limits.refusal_window_s:
            state.window_start_s, state.refusals = now, 0
        state.refusals += 1
        if state.refusals <= limits.max_refusals:
            return False
        state.ignored_until_s, state.refusals = now + limits.cooloff_s, 0
        self.counters["senders_ignored"] += 1
        log.error("ignoring %s for %.0f s: more than %d refused messages within %.0f s (a broken or hostile "
                  "client); its sessions are forgotten and its messages dropped unread until then",
                  name(), limits.cooloff_s, limits.max_refusals, limits.refusal_window_s)
        return True

    def prune(self, now: float) -> None:
        """Forget senders with nothing to remember: a full bucket, no recent refusal, not ignored."""
        if now - self._last_prune_s < 1.0:
            return
        self._last_prune_s = now
        limits = self.limits
        idle_s = max(limits.refusal_window_s, limits.burst_messages / limits.max_messages_per_s)
        for sender, state in list(self._senders.items()):
            if now - state.last_s > idle_s and now >= state.ignored_until_s:
                del self._senders[sender]
