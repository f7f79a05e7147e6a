"""The weight swap on the edge: two policy objects and the rule that moves weights between them.

Written once, used on both sides of the process boundary: by the edge node for a policy that
runs in the control process (``robot_rl.edge.learner_link`` loads, the node's inference worker
swaps) and by the policy process for one that runs in a process of its own
(``robot_rl.edge.process_runner``: its loader loads, its inference threads swap).

The rule (``WeightSwap``):

* exactly two policy objects: the *live* one that computes chunks and one *shadow*, allocated
  once (``prepare``; never per swap: no ``deepcopy``, no fresh memory for the allocator to chew
  on while the arm moves);
* new weights are copied into the shadow (``load_weights_into``) by a loader thread, then offered
  (``offer``); the inference side takes the offer right before it computes its next chunk
  (``take``) and says how it went (``settle``): on success the dropped policy becomes the next
  shadow, on failure the shadow stays the shadow and the live weights keep running;
* newer weights withdraw an offer nobody has taken yet (``free_shadow``: the latest version wins
  anyway); an offer already taken is waited out, for the length of one chunk.

A weight version's path reads one way: the learner link verifies the download, the loader
loads it into the shadow and offers it, the inference runner takes and applies it between two
chunks, the chunk it computes carries the version, every Step executed from that chunk carries
it (``Step.policy_version``), and the link's heartbeat reports the version of the newest
executed step: a swap counts when it has really happened, not when the weights arrived.

Loading the weights into the shadow is ``robot_rl.edge.weight_loading``'s (PyTorch): this module
needs none, so a robot whose policy has no model (the scripted expert, ``policy=hold``) runs without it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from robot_rl.edge.inference import PolicySwap


class WeightSwap:
    """The double-buffer rule between one loader thread and the inference side (see the module doc).

    >>> swap = WeightSwap(policy, version=0)
    >>> shadow = swap.free_shadow()            # loader: None while a swap of it is being applied
    >>> load_weights_into(shadow, data); swap.offer(PolicySwap(version=3, policy=shadow))
    >>> taken = swap.take()                    # inference side, right before the next chunk
    >>> swap.settle(taken, error=None)         # applied: the dropped policy is the next shadow
    """

    def __init__(self, live: Any, version: int = 0) -> None:
        self.live = live
        self.version = version
        self._shadow: Any = None
        self._lock = threading.Lock()  # the loader and the inference side; never held for more than a swap of names
        self._pending: PolicySwap | None = None  # offered, not taken
        self._taken: PolicySwap | None = None  # taken, not settled
        self.recycled = 0  # swaps applied: the dropped policy became the next shadow
        self.withdrawn = 0  # offers superseded by newer weights before anyone took them

    def prepare(self) -> Any:
        """Allocate the shadow once (off the control path; ``shadow_of``); returns it."""
        from robot_rl.edge.weight_loading import shadow_of  # PyTorch: only a policy with a model has a shadow

        with self._lock:
            if self._shadow is None:
                self._shadow = shadow_of(self.live)
            return self._shadow

    def free_shadow(self) -> Any | None:
        """The shadow, once nothing but the caller can read it: an offer of it not taken yet is
        withdrawn (newer weights supersede it); None while the inference side applies it (a chunk's
        length: the caller tries again in a few ms)."""
        self.prepare()
        with self._lock:
            if self._pending is not None and self._pending.policy is self._shadow:
                self._pending = None
                self.withdrawn += 1
            if self._taken is not None and self._taken.policy is self._shadow:
                return None
            return self._shadow

    def offer(self, swap: PolicySwap) -> None:
        """Use ``swap`` from the next chunk on; an earlier offer not taken yet is replaced (latest wins)."""
        with self._lock:
            self._pending = swap

    def withdraw(self, policy: object) -> bool:
        """Take back the offer of ``policy`` if nobody has taken it; True if it was still pending."""
        with self._lock:
            if self._pending is None or self._pending.policy is not policy:
                return False
            self._pending = None
            return True

    def take(self, on_take: Callable[[], None] | None = None) -> PolicySwap | None:
        """The offer, for the chunk about to be computed (None: keep the running weights).
        ``on_take`` runs under the same lock when there is one (a runner of several threads
        announces the swap there, before any other thread can start a prediction)."""
        with self._lock:
            swap, self._pending = self._pending, None
            if swap is not None:
                self._taken = swap
                if on_take is not None:
                    on_take()
            return swap

    def settle(self, swap: PolicySwap, error: str | None) -> None:
        """``swap`` was applied (``error`` None) or refused: the dropped policy becomes the next shadow,
        or the shadow stays what it was."""
        with self._lock:
            if self._taken is swap:
                self._taken = None
            if error is not None:
                return
            self.version = swap.version
            if swap.policy is not None and swap.policy is self._shadow:
                self.live, self._shadow = self._shadow, self.live
                self.recycled += 1
