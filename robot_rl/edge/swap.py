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

Why loads copy in slices from views (measured: a 100 MB model used to cost ~45 late ticks per
swap): a loader in the control process shares the interpreter lock with the control thread, so
it must never run a long Python-level operation. Weights go straight from the received buffer
into the shadow's tensors: ``torch.frombuffer`` views of the safetensors bytes (no deserialised
copy, no float32 cast copy), copied with ``Tensor.copy_`` in slices of a few MB, with the lock
released.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from robot_rl.bridges.zmq.weights import TensorView, tensor_views
from robot_rl.edge.inference import PolicySwap
from robot_rl.policies.trainable import published_state

_TORCH_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                 "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                 "BOOL": torch.bool}
LOAD_SLICE_BYTES = 4 << 20  # per copy_ call: the GIL is taken back (and offered to the control thread) between slices


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


def load_weights_into(module: torch.nn.Module, data: bytes | bytearray | memoryview,
                      slice_bytes: int = LOAD_SLICE_BYTES) -> int:
    """Copy safetensors ``data`` into ``module``'s own tensors, in place; return the bytes read.

    Zero-copy on the input side: each tensor is a ``torch.frombuffer`` view of ``data``
    (writable buffers only, like the link's assembly buffer; a read-only one is copied once),
    cast to the parameter's dtype by ``copy_`` itself (fp16/bf16 transfers need no extra
    buffer). Names and shapes must match what ``module`` publishes (``published_state``: its state
    dict, or a trainable policy's published part) exactly (``ValueError``
    otherwise, before anything is written); malformed bytes raise ``WeightsError``.
    """
    views = tensor_views(data)
    target = published_state(module)
    wrong = sorted(k for k in target if k not in views or views[k].shape != tuple(target[k].shape))
    extra = sorted(set(views) - set(target))
    if wrong or extra:
        raise ValueError(f"weights do not fit the running policy (mismatched {wrong[:5]}, unexpected {extra[:5]})")
    if memoryview(data).readonly:
        data = bytearray(data)  # torch.frombuffer wants a writable buffer (it never writes here)
    copied = 0
    with torch.no_grad():
        for name, view in views.items():
            _copy_slices(target[name], data, view, slice_bytes)
            copied += view.nbytes
    return copied


def _copy_slices(dst: torch.Tensor, data: bytes | bytearray | memoryview, view: TensorView, slice_bytes: int) -> None:
    if view.numel == 0:
        return
    dtype = _TORCH_DTYPES[view.dtype]
    if view.nbytes <= slice_bytes and dst.dtype == dtype and dst.device.type == "cpu" and dst.is_contiguous():
        # A plain memcpy on this thread, the GIL released as by copy_. torch's copy_ of a tensor above
        # 32K elements is a parallel region that waits for its slowest worker thread, and after an idle
        # second its first one took 12 ms on 2 cores against 1.2 ms on one thread (outside the bench):
        # hundreds of small tensors per LoRA adapter, each waiting for threads, when one suffices.
        raw = np.frombuffer(data, np.uint8, view.nbytes, view.offset)
        np.copyto(dst.detach().view(-1).view(torch.uint8).numpy(), raw)
        return
    src = torch.frombuffer(data, dtype=dtype, count=view.numel, offset=view.offset)
    if not dst.is_contiguous():
        dst.copy_(src.view(view.shape))
        return
    flat = dst.view(-1)
    step = max(1, slice_bytes // src.element_size())
    for start in range(0, view.numel, step):
        flat[start : start + step].copy_(src[start : start + step])


def shadow_of(policy: torch.nn.Module) -> Any:
    """The second policy object weights are loaded into: its published tensors are its own, and
    every tensor that never travels (a frozen VLM, a LoRA adapter's base) is the live policy's,
    shared, because no swap ever writes it: a 0.9 GB SmolVLM is held once, not twice."""
    published = {t.data_ptr() for t in published_state(policy).values() if t.numel()}
    memo: dict[int, Any] = {}
    for tensor in (*policy.parameters(), *policy.buffers()):
        if tensor.numel() and tensor.data_ptr() not in published:
            memo[id(tensor)] = tensor
    return copy.deepcopy(policy, memo).eval()
