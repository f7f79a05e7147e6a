"""Fully sharded data-parallel training (torch's FSDP2, ``fully_shard``): ``learner.trainer.parallel=fsdp``.

Why: under DDP every rank holds the whole model, its gradients and Adam's two moments: full
fine-tuning of pi0 (3 B parameters) keeps ~50 GB of float32 on every GPU. Sharded, each rank keeps
1/N of each and gathers a unit's weights only while that unit computes, as LeRobot's FSDP2 path does.

Everything else is the data-parallel trainer's (``robot_rl.learner.ddp``): rank 0 samples and
broadcasts the batch, every rank computes the loss of its shard of rows, the gradients are averaged
(each rank receives the average of its slice: a reduce-scatter), and every rank steps its slice of
the weights and of the optimiser state, so N ranks compute what one process would on the batch.

What is sharded: each element of every ``nn.ModuleList`` (transformer layers, U-Net stages: the
units whose weights are gathered one at a time), then the rest as one root unit. Scalar parameters
(FlowVLA's ``log_temperature``), which FSDP2 cannot shard, stay whole on every rank, and their
gradients are averaged over the ranks as they arrive (``dist.all_reduce``), as DDP would.

Publishing and checkpoints need the whole weights: rank 0 keeps them in a CPU copy of the policy,
which ``gather_trained`` refreshes before each publish and checkpoint, tensor by tensor, with every
rank taking part. The copy is what robots get and checkpoints hold (a LeRobot policy's in LeRobot's
own layout), as LeRobot gathers the full state dict on rank 0.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor


def shard_module(root: nn.Module, device: torch.device, world_size: int) -> nn.Module:
    """Shard ``root`` over the ``world_size`` ranks in place: each ``nn.ModuleList`` element as its own
    unit, the rest as the root unit. Every rank must hold the same weights first (each keeps its slice
    of its own copy). The parameters become new ``DTensor`` parameters: build optimisers after this."""
    mesh = init_device_mesh(device.type, (world_size,))
    scalars = {param for param in root.parameters() if param.ndim == 0}
    for param in scalars:
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(average_over_ranks)
    units = [block for module in root.modules() if isinstance(module, nn.ModuleList) for block in module
             if any(True for _ in block.parameters())]
    for block in reversed(units):  # inner units before the ones around them
        fully_shard(block, mesh=mesh, ignored_params=scalars)
    fully_shard(root, mesh=mesh, ignored_params=scalars)
    return root


def average_over_ranks(param: torch.Tensor) -> None:
    """A whole (unsharded) parameter's gradient, averaged over the ranks (every rank calls it in the same order)."""
    assert param.grad is not None
    dist.all_reduce(param.grad)
    param.grad.div_(dist.get_world_size())


def gather_trained(sharded: nn.Module, whole: nn.Module | None) -> None:
    """Collective (every rank, same order): copy ``sharded``'s trainable parameters, all-gathered, and
    its buffers (never sharded) into ``whole``, a copy of the same module made before sharding (rank 0;
    None on the others, which only take part). Frozen parameters never change: the copy has them."""
    targets = dict(whole.named_parameters()) if whole is not None else {}
    with torch.no_grad():
        for name, param in sharded.named_parameters():
            if not param.requires_grad:
                continue
            full = param.full_tensor() if isinstance(param, DTensor) else param
            if whole is not None:
                targets[name].copy_(full)
        if whole is not None:
            buffers = dict(whole.named_buffers())
            for name, buffer in sharded.named_buffers():
                buffers[name].copy_(buffer)


def gather_optimizer_state(optimizer: torch.optim.Optimizer, keep: bool) -> dict[str, Any]:
    """Collective: ``optimizer.state_dict()`` with each sharded tensor all-gathered to the CPU, one at a time:
    what one process's optimiser over the whole weights would hold (kept only where ``keep``: rank 0;
    the other ranks take part and drop each tensor)."""
    saved = optimizer.state_dict()
    state: dict[Any, dict[str, Any]] = {}
    for param_id, values in saved["state"].items():
        whole = {}
        for key, value in values.items():
            if isinstance(value, DTensor):
                value = value.full_tensor()
            whole[key] = value.cpu() if keep and isinstance(value, torch.Tensor) else value
        if keep:
            state[param_id] = whole
    return {"state": state, "param_groups": saved["param_groups"]}
