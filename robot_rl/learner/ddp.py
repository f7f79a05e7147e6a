"""Data-parallel training under ``torchrun``: one learner, N ranks, DDP gradient all-reduce.

Who does what:

* **Rank 0 (the leader)** is the normal learner: it owns the wire server, the replay
  store, the sampling order (its index and RNG), publishing and checkpoints. For every
  update it samples one *global* batch and broadcasts it to all ranks.
* **Every rank** runs the same algorithm update on that batch, but the policy's
  ``compute_loss`` only sees the rank's contiguous shard of rows and goes through a
  ``DistributedDataParallel`` wrapper, so the gradients are averaged across ranks during
  ``backward``. Gradient clipping and the optimiser step then run on identical averaged
  gradients: all ranks keep bit-identical parameters.
* **Why the whole batch travels and not only the shard**: algorithms draw their loss's
  randomness (flow noise and times) from their own generator for ``len(batch)`` rows. Every
  rank has the same generator state, draws the noise for the whole batch and keeps its rows, so N ranks
  compute exactly what one process would compute on the same batch (mean of equal-size
  shard means = mean of the batch), up to float summation order.

The batch channel is a small framing of its own (a JSON header in a uint8 tensor, then
one ``broadcast`` per tensor): nothing is pickled between ranks. Control messages
(idle, stop) travel the same way, so followers never sit in a collective that the
leader will not join, and an idle learner keeps the process group alive.

* **Weighted losses are exact**: a rank's loss is its shard's weighted mean scaled by
  ``world_size * shard_weight_sum / batch_weight_sum``, so the gradients DDP averages are those
  of the batch's weighted mean (``sum w l / sum w``) whatever weights land on which rank.
* **Critics** (the extra modules of ``awr`` and ``rl``) are small next to the policy and read the
  whole batch, which every rank holds: every rank runs the same critic step on it, and after
  each update rank 0's extra modules are broadcast, so ranks cannot drift apart even where GPU
  kernels are not bit-deterministic. Only the policy's loss is sharded.

The global ``batch_size`` must divide by the world size. On ``--resume`` every rank reads the
same checkpoint directory (shared storage across nodes).

``learner.trainer.parallel=fsdp`` shards the model over the ranks instead of copying it
(``robot_rl.learner.fsdp``); the protocol above is the same, and rank 0 asks every rank to gather
the weights (``OP_GATHER``) before it publishes or checkpoints them.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from robot_rl.core.errors import ConfigError
from robot_rl.learner.algorithms.config import ALGORITHMS
from robot_rl.learner.config import LearnerConfig, Parallelism, TrainerConfig
from robot_rl.learner.index import SamplingIndex
from robot_rl.learner.publisher import PublishFn
from robot_rl.learner.trainer import Trainer
from robot_rl.policies.trainable import TrainablePolicy

log = logging.getLogger(__name__)

OP_UPDATE, OP_IDLE, OP_STOP = 1, 2, 3
# Sharded weights: every rank gathers them for rank 0 to publish, or to checkpoint with the optimiser's state.
OP_GATHER, OP_GATHER_CHECKPOINT = 4, 5


@dataclass(frozen=True)
class DistContext:
    """This process's place in the data-parallel job."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device

    @property
    def is_leader(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ


def init_distributed(device: str = "auto", timeout_s: float = 1800.0) -> DistContext | None:
    """Join the process group torchrun describes in the environment; None for a single process.

    NCCL with one GPU per rank (``cuda:LOCAL_RANK``) when CUDA is present and ``device``
    allows it, gloo on CPU otherwise.
    """
    if not launched_by_torchrun():
        return None
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = (device == "auto" and torch.cuda.is_available()) or device.startswith("cuda")
    if use_cuda:
        torch.cuda.set_device(local_rank)
        backend, dev = "nccl", torch.device("cuda", local_rank)
    else:
        backend, dev = "gloo", torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    log.info("data-parallel rank %d/%d (%s on %s)", rank, world, backend, dev)
    return DistContext(rank=rank, world_size=world, local_rank=local_rank, backend=backend, device=dev)


def shutdown_distributed() -> None:
    """Leave the group together: a rank that destroys it while a peer's last message is still
    in flight can abort inside gloo ("terminate called without an active exception")."""
    if dist.is_initialized():
        try:
            dist.barrier()
        except Exception:  # noqa: BLE001 - a peer already gone: nothing left to wait for
            log.warning("barrier before leaving the process group failed; leaving anyway")
        dist.destroy_process_group()


# ---------------------------------------------------------------- batch channel (rank 0 -> all)


class BatchChannel:
    """Broadcasts control messages and batches from rank 0, without pickle.

    Wire: ``[op, header_bytes, weights_version]`` (int64), then the JSON header (uint8), then each tensor
    named in the header in order. Lists of strings (instructions) ride in the header.
    """

    def __init__(self, ctx: DistContext) -> None:
        self.ctx = ctx

    def send(self, op: int, batch: dict[str, Any] | None = None, version: int = 0) -> None:
        assert self.ctx.is_leader, "only rank 0 sends"
        tensors, header = _describe(batch or {})
        raw = json.dumps(header).encode() if batch else b""  # control-only messages carry no header
        self.broadcast(torch.tensor([op, len(raw), version], dtype=torch.int64))
        if raw:
            self.broadcast(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
        for tensor in tensors:
            self.broadcast(tensor.contiguous())

    def receive(self) -> tuple[int, dict[str, Any] | None, int]:
        """(op, batch or None, rank 0's weights version)."""
        assert not self.ctx.is_leader, "rank 0 sends, the others receive"
        control = self.broadcast(torch.zeros(3, dtype=torch.int64))
        op, size, version = int(control[0]), int(control[1]), int(control[2])
        if size == 0:
            return op, None, version
        header = json.loads(bytes(self.broadcast(torch.empty(size, dtype=torch.uint8)).cpu().numpy()))
        batch: dict[str, Any] = dict(header["lists"])
        for spec in header["tensors"]:
            buf = torch.empty(spec["shape"], dtype=getattr(torch, spec["dtype"]))
            batch[spec["name"]] = self.broadcast(buf)
        return op, batch, version

    def broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        """Broadcast from rank 0 on the backend's device; returns the (CPU) result."""
        on_device = tensor.to(self.ctx.device)
        dist.broadcast(on_device, src=0)
        return on_device.cpu() if on_device.device.type != "cpu" else on_device


def _describe(batch: dict[str, Any]) -> tuple[list[torch.Tensor], dict[str, Any]]:
    if not batch:
        return [], {}
    tensors, specs, lists = [], [], {}
    for name, value in batch.items():
        if isinstance(value, torch.Tensor):
            specs.append({"name": name, "dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape)})
            tensors.append(value)
        elif isinstance(value, np.ndarray):
            tensor = torch.as_tensor(value)
            specs.append({"name": name, "dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape)})
            tensors.append(tensor)
        elif isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            lists[name] = list(value)
        else:
            raise TypeError(f"batch[{name!r}] is a {type(value).__name__}; the data-parallel channel carries "
                            "tensors, arrays and lists of strings only")
    return tensors, {"tensors": specs, "lists": lists}


# ---------------------------------------------------------------- DDP around compute_loss


class _LossModule(nn.Module):
    """``forward`` = the policy's own ``compute_loss``: DDP syncs gradients only for calls through forward."""

    def __init__(self, policy: TrainablePolicy, compute_loss: Callable[..., Any]) -> None:
        super().__init__()
        self.policy = policy
        self._compute_loss = compute_loss

    def forward(self, batch: dict, weights: torch.Tensor | None, randomness: dict[str, Any]) -> Any:
        return self._compute_loss(batch, weights, **randomness)


def shard_rows(value: Any, rows: slice) -> Any:
    """Rows ``rows`` of a batch value (tensor, array or list); None and scalars pass through."""
    if isinstance(value, torch.Tensor | np.ndarray | list | tuple):
        return value[rows]
    return value


def route_loss_through_ddp(policy: TrainablePolicy, ctx: DistContext, batch_size: int) -> nn.Module:
    """``route_loss`` through a DDP wrapper, which all-reduces the gradients in ``backward``.
    Constructing DDP broadcasts rank 0's parameters and buffers, so all ranks start identical."""
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return route_loss(policy, ctx, batch_size, lambda module: DistributedDataParallel(module, device_ids=device_ids))


def _sharding() -> ModuleType:
    """``robot_rl.learner.fsdp``, imported by a sharded run only: torch's FSDP2 and DTensor take ~0.5 s
    to import, which every learner start, and every restart after a crash, would pay otherwise."""
    from robot_rl.learner import fsdp

    return fsdp


def route_loss_through_fsdp(policy: TrainablePolicy, ctx: DistContext, batch_size: int) -> nn.Module:
    """``route_loss`` through the policy sharded by FSDP2 (``fsdp.shard_module``), which averages each
    rank's slice of the gradients in ``backward``. The ranks must hold rank 0's weights first."""
    sharding = _sharding()
    return route_loss(policy, ctx, batch_size, lambda module: sharding.shard_module(module, ctx.device, ctx.world_size))


def route_loss(policy: TrainablePolicy, ctx: DistContext, batch_size: int,
               wrap: Callable[[nn.Module], nn.Module]) -> nn.Module:
    """Make ``policy.compute_loss`` compute this rank's shard through ``wrap`` (DDP or FSDP) around it.

    Algorithms call ``self.policy.compute_loss(batch, weights, **randomness)`` with the whole
    batch and the randomness drawn for it (``draw_training_randomness``); the replacement keeps
    rows ``[rank*n, (rank+1)*n)`` of every argument (``n`` = rows / world size: ``rl`` regresses
    on twice the batch) and calls the wrapper, whose ``backward`` averages the ranks' gradients.
    """
    if batch_size % ctx.world_size:
        raise ValueError(f"trainer.batch_size {batch_size} must divide by the world size {ctx.world_size} "
                         "(each rank trains on an equal shard)")
    original = policy.compute_loss
    ddp = wrap(_LossModule(policy, original))

    def compute_shard_loss(batch: dict, weights: torch.Tensor | None = None, **randomness: Any) -> Any:
        total = len(batch["actions"])
        if total % ctx.world_size:
            raise ValueError(f"a data-parallel loss needs rows divisible by the world size {ctx.world_size}, "
                             f"got {total}")
        n = total // ctx.world_size
        rows = slice(ctx.rank * n, (ctx.rank + 1) * n)
        shard = {k: shard_rows(v, rows) for k, v in batch.items()}
        shard_weights = shard_rows(weights, rows)
        loss, per_sample = ddp(shard, shard_weights, {k: shard_rows(v, rows) for k, v in randomness.items()})
        if weights is not None:  # the ranks are averaged: make that average the batch's weighted mean
            total_weight = torch.as_tensor(weights, dtype=torch.float64).sum()
            shard_weight = torch.as_tensor(shard_weights, dtype=torch.float64).sum()
            share = ctx.world_size * shard_weight / total_weight if total_weight > 0 else torch.zeros(())
            loss = loss * share.to(loss.dtype)
        return loss, per_sample

    # The algorithms keep calling policy.compute_loss: this instance attribute shadows the method.
    policy.compute_loss = compute_shard_loss  # shadows the method on purpose
    return ddp


# ---------------------------------------------------------------- the trainer


class DistributedTrainer(Trainer):
    """A ``Trainer`` on every rank; rank 0 samples and broadcasts, all ranks update together.

    Leader: use it exactly like ``Trainer`` (``start``/``stop``, inside ``LearnerService``).
    Followers: ``follow()`` until the leader says stop. The first collective (``connect``)
    runs at the start of training on every rank.
    """

    def __init__(self, policy: TrainablePolicy, index: SamplingIndex, config: TrainerConfig, algorithm_config: object,
                 ctx: DistContext, publish: PublishFn | None = None,
                 on_checkpoint: Callable[[Path], None] | None = None, logger: Any = None) -> None:
        self.sharded = config.parallel is Parallelism.fsdp
        if self.sharded and config.ema_decay is not None:
            raise ConfigError("learner.trainer.parallel=fsdp keeps no moving average (trainer.ema_decay=null)")
        # Sharded, the whole weights live only here: rank 0's CPU copy, gathered before each publish/checkpoint.
        self._whole = copy.deepcopy(policy).cpu() if self.sharded and ctx.is_leader else None
        super().__init__(policy, index, config, algorithm_config, publish=publish if ctx.is_leader else None,
                         on_checkpoint=on_checkpoint if ctx.is_leader else None,
                         logger=logger if ctx.is_leader else None)
        if self.sharded and self.algorithm.extra_modules():
            raise ConfigError(f"learner.trainer.parallel=fsdp trains algorithms without critics (bc, hgdagger, rwr); "
                              f"{type(self.algorithm).__name__}'s critics read the policy outside its loss, where "
                              "sharded weights are not gathered (learner.trainer.parallel=ddp)")
        self.ctx = ctx
        self.channel = BatchChannel(ctx)
        self._wrapped: nn.Module | None = None  # the DDP or FSDP module the loss runs through
        self._whole_optimizer_states: dict[str, dict[str, Any]] = {}  # sharded: gathered for rank 0's checkpoint
        self._gathered: tuple[int, int] | None = None  # (update, op) of the last gather
        self._statistics_to_sync = True

    @property
    def deployed(self) -> TrainablePolicy:
        """Sharded: rank 0's copy of the whole weights as last gathered (the published ones)."""
        return self._whole if self._whole is not None else super().deployed

    def connect(self) -> None:
        """Collective: agree on the step (after a resume), wrap the policy in DDP or shard it with FSDP."""
        if self._wrapped is not None:
            return
        state = torch.tensor([self.step, self.version], dtype=torch.int64)
        leader_state = self.channel.broadcast(state.clone())
        if not self.ctx.is_leader and int(leader_state[0]) != self.step:
            raise RuntimeError(f"rank {self.ctx.rank} is at update {self.step} but rank 0 resumed at update "
                               f"{int(leader_state[0])}; every rank must see the same checkpoint directory")
        if self.sharded:
            self._broadcast_from_leader([*self.policy.parameters(), *self.policy.buffers()])
            self._wrapped = route_loss_through_fsdp(self.policy, self.ctx, self.config.batch_size)
            # Sharding made new parameter tensors: the algorithm's optimiser steps those (each rank its slices).
            self.algorithm = ALGORITHMS.build(self.algorithm_config, self.policy, self.config, self.device)
        else:
            self._wrapped = route_loss_through_ddp(self.policy, self.ctx, self.config.batch_size)
        self.version = int(leader_state[1])
        self.algorithm.set_policy_version(self.version)
        # Same sampling-noise generator on every rank, whatever happened before.
        rng = self.channel.broadcast(self.algorithm.rng_state().clone())
        self.algorithm.set_rng_state(rng)
        self._sync_extra_modules()
        self._statistics_to_sync = True

    def _gather(self, op: int) -> None:
        """Collective: the sharded weights into rank 0's copy, with ``OP_GATHER_CHECKPOINT`` also the
        optimisers' state (kept whole on rank 0). Rank 0 decides and tells the others first; what it
        gathered at this update already is not gathered again."""
        if self.ctx.is_leader:
            if self._gathered in ((self.step, op), (self.step, OP_GATHER_CHECKPOINT)):
                return
            self.channel.send(op)
        _sharding().gather_trained(self.policy, self._whole)
        if op == OP_GATHER_CHECKPOINT:
            self._whole_optimizer_states = {name: _sharding().gather_optimizer_state(optimizer, keep=self.ctx.is_leader)
                                            for name, optimizer in self.algorithm.optimizers().items()}
        self._gathered = (self.step, op)

    def _publish_locked(self) -> None:
        if self.sharded:
            self._gather(OP_GATHER)
        super()._publish_locked()

    def optimizer_states(self) -> dict[str, dict[str, Any]]:
        if self.sharded:
            return self._whole_optimizer_states
        return super().optimizer_states()

    def resume(self, path: str | Path | None = None, *, check_index: bool = True) -> Path:
        if self.sharded:
            raise ConfigError("--resume under learner.trainer.parallel=fsdp is not supported yet; start a new learner "
                              "from the checkpoint's weights with learner.init_checkpoint=DIR")
        return super().resume(path, check_index=check_index)

    def _before_update(self) -> None:
        """Collective: on the first update, rank 0's policy buffers (its normaliser is fitted on the first
        batch it samples) reach every rank before a critic reads features through them."""
        if self._statistics_to_sync:
            self._broadcast_from_leader(list(self.policy.buffers()))
            self._statistics_to_sync = False

    def _sync_extra_modules(self) -> None:
        """Collective: rank 0's critics (parameters and buffers) on every rank."""
        for module in self.algorithm.extra_modules().values():
            self._broadcast_from_leader([*module.parameters(), *module.buffers()])

    def _broadcast_from_leader(self, tensors: list[torch.Tensor]) -> None:
        for tensor in tensors:
            synced = tensor.detach().to(self.ctx.device)
            dist.broadcast(synced, src=0)
            with torch.no_grad():
                tensor.copy_(synced)

    # ------------------------------------------------------------ leader

    def update_once(self) -> dict[str, float] | None:
        if not self.ctx.is_leader:
            raise RuntimeError("only rank 0 drives updates; other ranks call follow()")
        self.connect()
        if self.paused or not self.ready():
            self.channel.send(OP_IDLE)  # keeps followers in step and the group alive
            return None
        with self._lock:
            batch = self._sample_locked()
            self.channel.send(OP_UPDATE, batch, self.version)
            self._before_update()
            metrics = self._apply_locked(batch)
            self._sync_extra_modules()
            return metrics

    def _run(self) -> None:
        try:
            super()._run()
        finally:
            self._send_stop()

    def _send_stop(self) -> None:
        try:
            self.connect()
            if self.sharded:  # the final checkpoint comes after the other ranks have stopped: gather for it now
                with self._lock:
                    self._gather(OP_GATHER_CHECKPOINT)
            self.channel.send(OP_STOP)
            log.info("told %d follower rank(s) to stop after update %d", self.ctx.world_size - 1, self.step)
        except Exception:  # a follower already gone: torchrun tears the group down anyway
            log.exception("could not tell the follower ranks to stop")

    def _checkpoint_locked(self) -> Path:
        if not self.ctx.is_leader:
            raise RuntimeError("only rank 0 writes checkpoints")
        if self.sharded:
            self._gather(OP_GATHER_CHECKPOINT)
        return super()._checkpoint_locked()

    # ------------------------------------------------------------ followers

    def follow(self) -> int:
        """Run the leader's updates until it says stop; returns the number of updates done."""
        if self.ctx.is_leader:
            raise RuntimeError("rank 0 leads; follow() is for the other ranks")
        self.connect()
        while True:
            op, batch, version = self.channel.receive()
            if op == OP_STOP:
                log.info("rank %d: stop after update %d", self.ctx.rank, self.step)
                return self.step
            if op == OP_IDLE:
                continue
            if op in (OP_GATHER, OP_GATHER_CHECKPOINT):
                with self._lock:
                    self._gather(op)
                continue
            if op != OP_UPDATE or batch is None:
                raise RuntimeError(f"rank {self.ctx.rank}: unexpected op {op} from rank 0")
            with self._lock:
                if version != self.version:  # staleness-aware algorithms measure against rank 0's version
                    self.version = version
                    self.algorithm.set_policy_version(version)
                self._before_update()
                metrics = self.update_or_skip(batch)  # every rank sees the same all-reduced gradient: same skips
                self._sync_extra_modules()
                if metrics is not None:
                    self.last_metrics = metrics
                    self.step += 1


def follow_rank(config: LearnerConfig, policy: TrainablePolicy, ctx: DistContext, *, resume: bool = False) -> int:
    """What ranks other than 0 run under ``robot-rl learner``: follow rank 0's updates until it stops.

    SIGINT/SIGTERM are ignored here on purpose: rank 0 catches them, writes its final
    checkpoint and then tells every follower to stop, so no rank leaves a collective half-done.
    """
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: log.info("rank %d: signal %d; waiting for rank 0 to stop us",
                                                          ctx.rank, signum))
    if config.store.joint_names is not None:
        policy.bind_joints(config.store.joint_names)
    elif getattr(policy, "joint_names", None):  # rank 0 learns the order from a robot's hello; this rank never does
        raise ConfigError("policy.joint_names under torchrun needs learner.store.joint_names (the robots' joint "
                          "order), so every rank reorders its shard alike")
    trainer = DistributedTrainer(policy, SamplingIndex(config.store.cameras or policy.cameras), config.trainer,
                                 config.algorithm,
                                 ctx)
    if resume:
        trainer.resume(check_index=False)
    return trainer.follow()
