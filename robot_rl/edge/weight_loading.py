"""Loading published weights into a policy on the edge: the shadow's tensors, in place.

Why loads copy in slices from views (measured: a 100 MB model used to cost ~45 late ticks per
swap): a loader in the control process shares the interpreter lock with the control thread, so
it must never run a long Python-level operation. Weights go straight from the received buffer
into the shadow's tensors: ``torch.frombuffer`` views of the safetensors bytes (no deserialised
copy, no float32 cast copy), copied with ``Tensor.copy_`` in slices of a few MB, with the lock
released.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from robot_rl.bridges.zmq.weights import TensorView, tensor_views
from robot_rl.policies.trainable import published_state

_TORCH_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                 "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                 "BOOL": torch.bool}
LOAD_SLICE_BYTES = 4 << 20  # per copy_ call: the GIL is taken back (and offered to the control thread) between slices


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
