"""Data-parallel trainer: 2 CPU ranks (gloo) under torchrun, on loopback.

The same file is the rank worker: ``torchrun -m tests.test_learner_ddp OUT ACT_DIR GROUP`` trains
the runs of ``RUN_GROUPS[GROUP]`` one after the other in one process group (one start-up): one tiny
FlowVLA per algorithm, the LeRobot ACT in ACT_DIR, and both sharded (``learner.trainer.parallel=fsdp``).
Rank 0 holds the data (the ranks start from different initial weights on purpose); after each run
every rank writes its parameters, its critics and what it published and checkpointed under OUT/RUN.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from safetensors.torch import load_file, save_file

from robot_rl.learner.algorithms.config import AWRConfig, RLConfig
from robot_rl.learner.trainer import Trainer
from tests.learner_helpers import BC, tiny_policy, trainer_config

pytestmark = pytest.mark.slow  # processes end to end: started first when the suite runs in parallel

REPO = Path(__file__).resolve().parents[1]
UPDATES = 4
BATCH = 8
# Behaviour cloning, and the two algorithms with critics (weights differ per sample, so a rank's
# shard carries its own weight sum; rl regresses on twice the batch once it distils).
ALGORITHMS = {"bc": BC, "awr": AWRConfig(critic_hidden=16),
              "rl": RLConfig(critic_hidden=16, num_candidates=3, warmup_updates=0)}


def ddp_trainer_config(root: Path, rank: int, parallel: str = "ddp"):
    return trainer_config(root / f"ckpt-rank{rank}", batch_size=BATCH, publish_every_updates=2,
                          checkpoint_every_updates=2, max_updates=UPDATES, parallel=parallel)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torchrun(args: list[str], timeout_s: float, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory) -> Path:
    from tests.lerobot_policies import tiny_act_dir

    out = tmp_path_factory.mktemp("ddp")
    act = tiny_act_dir(out / "act-start", chunk_size=4)
    for group in RUN_GROUPS:
        proc = run_torchrun(["-m", "tests.test_learner_ddp", str(out), str(act), group], timeout_s=400)
        assert proc.returncode == 0, (f"torchrun {group} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                                      f"{proc.stderr[-5000:]}")
    return out


@pytest.fixture(params=sorted(ALGORITHMS))
def ddp_run(request, ddp_runs) -> tuple[str, Path]:
    return request.param, ddp_runs / request.param


def test_ranks_end_bit_identical(ddp_run):
    name, out = ddp_run
    for part in ("policy", "extra"):
        rank0, rank1 = (load_file(str(out / f"rank{r}.{part}.safetensors")) for r in (0, 1))
        assert rank0.keys() == rank1.keys() and (part == "policy" or name == "bc" or rank0)
        for key in rank0:
            assert torch.equal(rank0[key], rank1[key]), f"{part} {key}"
    trained = load_file(str(out / "rank0.policy.safetensors"))["action_out.weight"]
    assert not torch.equal(trained, tiny_policy(seed=0).state_dict()["action_out.weight"])


def single_process(algorithm: str, root: Path) -> tuple[Trainer, list[float]]:
    """One process's UPDATES updates on the batches the data-parallel runs train on; its losses."""
    from tests.test_learner_trainer import filled_index

    single = Trainer(tiny_policy(seed=0), filled_index(), ddp_trainer_config(root, 0), ALGORITHMS[algorithm])
    params = dict(single.policy.named_parameters())
    single.loss_free = {name: torch.zeros_like(p, dtype=torch.bool) for name, p in params.items()}
    losses = []
    for _ in range(UPDATES):
        losses.append(single.update_once()["loss"])
        for name, p in params.items():
            single.loss_free[name] |= p.grad.abs() < 1e-6
    assert sum(int(m.sum()) for m in single.loss_free.values()) < 0.05 * sum(p.numel() for p in params.values())
    return single, losses


def assert_same_policy(saved: dict[str, torch.Tensor], single: Trainer) -> None:
    """``saved`` holds ``single``'s parameters and buffers.

    Elements whose gradient is numerically zero (biases right before a GroupNorm, attention
    key biases: the loss does not depend on them) are left out: AdamW turns float noise
    there into +-lr steps, in one process as much as in two.
    """
    for key, p in single.policy.named_parameters():
        keep = ~single.loss_free[key]
        torch.testing.assert_close(saved[key][keep], p.detach()[keep], rtol=1e-4, atol=1e-5, msg=key)
    for key, buf in single.policy.named_buffers():
        torch.testing.assert_close(saved[key], buf, msg=key)  # normaliser fitted on rank 0, same on all


def test_matches_a_single_process_on_the_same_batches(ddp_run, tmp_path):
    """Same parameters, critics and losses as one process on the same batches."""
    name, ddp_run = ddp_run
    single, losses = single_process(name, tmp_path)
    assert_same_policy(load_file(str(ddp_run / "rank0.policy.safetensors")), single)
    critics = load_file(str(ddp_run / "rank0.extra.safetensors"))
    for key, tensor in extra_state(single).items():
        torch.testing.assert_close(critics[key], tensor, rtol=1e-4, atol=1e-5, msg=key)
    shard_losses = [json.loads((ddp_run / f"rank{r}.json").read_text())["losses"] for r in (0, 1)]
    mean = [(a + b) / 2 for a, b in zip(*shard_losses, strict=True)]
    assert mean == pytest.approx(losses, rel=1e-4)


def test_a_lerobot_act_trains_data_parallel_and_its_checkpoint_loads_in_lerobot(ddp_runs):
    from lerobot.policies.factory import get_policy_class

    start, out = ddp_runs / "act-start", ddp_runs / "act"
    rank0, rank1 = (load_file(str(out / f"rank{r}.policy.safetensors")) for r in (0, 1))
    assert rank0.keys() == rank1.keys() and all(torch.equal(rank0[k], rank1[k]) for k in rank0)
    saved = sorted((out / "ckpt-rank0").glob("step-*"))[-1]
    reloaded = get_policy_class("act").from_pretrained(str(saved)).state_dict()
    initial = get_policy_class("act").from_pretrained(str(start)).state_dict()
    assert all(torch.equal(v, rank0[k]) for k, v in reloaded.items())
    assert any(not torch.equal(v, initial[k]) for k, v in reloaded.items())


def test_fsdp_ranks_hold_slices_and_rank_zero_publishes_and_checkpoints_what_one_process_trains(ddp_runs, tmp_path):
    """learner.trainer.parallel=fsdp: each rank keeps half of every sharded weight and of Adam's moments;
    the weights rank 0 gathers, publishes and checkpoints are one process's on the same batches."""
    from robot_rl.learner.checkpoint import read_checkpoint

    out = ddp_runs / "fsdp"
    single, losses = single_process("bc", tmp_path)
    leader, follower = (json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1))
    for report in (leader, follower):
        assert report["steps"] == UPDATES and report["local_params"] <= report["params"] / 2 + 1000
    assert leader["published"] == [1, 2] and follower["published"] == []
    assert [(a + b) / 2 for a, b in zip(leader["losses"], follower["losses"], strict=True)] == pytest.approx(
        losses, rel=1e-4)
    assert_same_policy(load_file(str(out / "rank0.policy.safetensors")), single)  # gathered at the last checkpoint
    weights, state = read_checkpoint(out / "ckpt-rank0" / "step-00000004")
    assert_same_policy(weights, single)
    [(name, moments)] = state.optimizers.items()
    expected = single.algorithm.optimizers()[name].state_dict()["state"]
    assert len(moments["state"]) == len(expected)
    for param_id, values in expected.items():  # whole moments, as one process's optimiser holds them
        assert moments["state"][param_id]["exp_avg"].shape == values["exp_avg"].shape
    assert not (out / "ckpt-rank1").exists()


def test_fsdp_checkpoints_a_lerobot_policy_in_lerobots_layout(ddp_runs):
    from lerobot.policies.factory import get_policy_class

    start, out = ddp_runs / "act-start", ddp_runs / "fsdp-act"
    gathered = load_file(str(out / "rank0.policy.safetensors"))
    saved = sorted((out / "ckpt-rank0").glob("step-*"))[-1]
    reloaded = get_policy_class("act").from_pretrained(str(saved)).state_dict()
    initial = get_policy_class("act").from_pretrained(str(start)).state_dict()
    assert reloaded.keys() == gathered.keys() and all(torch.equal(v, gathered[k]) for k, v in reloaded.items())
    assert any(not torch.equal(v, initial[k]) for k, v in reloaded.items())


@pytest.mark.parametrize("algorithm, overrides, match", [
    ("awr", {}, "without critics"), ("bc", {"ema_decay": 0.99}, "ema_decay=null")])
def test_fsdp_refuses_what_it_cannot_shard_in_one_line_before_any_collective(tmp_path, algorithm, overrides, match):
    from robot_rl.core.errors import ConfigError
    from robot_rl.learner.ddp import DistContext, DistributedTrainer
    from tests.test_learner_trainer import filled_index

    ctx = DistContext(rank=0, world_size=2, local_rank=0, backend="gloo", device=torch.device("cpu"))
    config = trainer_config(tmp_path, batch_size=BATCH, parallel="fsdp", **overrides)
    with pytest.raises(ConfigError, match=match):
        DistributedTrainer(tiny_policy(seed=0), filled_index(), config, ALGORITHMS[algorithm], ctx)


def test_only_rank_zero_publishes_and_checkpoints(ddp_run):
    _, ddp_run = ddp_run
    leader, follower = (json.loads((ddp_run / f"rank{r}.json").read_text()) for r in (0, 1))
    assert leader["published"] == [1, 2] and follower["published"] == []
    assert leader["steps"] == follower["steps"] == UPDATES
    assert sorted(p.name for p in (ddp_run / "ckpt-rank0").glob("step-*")) == ["step-00000002", "step-00000004"]
    assert not (ddp_run / "ckpt-rank1").exists()


def test_learner_command_under_torchrun_trains_streams_and_stops_on_sigterm(tmp_path):
    """``torchrun --nproc-per-node 2 -m ... learner``: rank 0 serves robots, both ranks train, SIGTERM checkpoints."""
    import signal

    from tests.test_learner_crash import _STARTED, Proc, edge_args, learner_overrides

    router, pub = free_port(), free_port()
    launcher = ("-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                "--master-port", str(free_port()))
    overrides = learner_overrides(tmp_path, router, pub, **{"learner.trainer.publish_every_updates": 3})
    learner = Proc("torchrun", ["learner", *overrides], tmp_path, launcher=launcher)
    try:
        learner.wait_for_output("learner up (2 data-parallel ranks)", 180)
        edge = Proc("edge", edge_args(tmp_path, router, pub, first_episode=1, episodes=1, name="edge"), tmp_path)
        assert edge.finish(120) == 0, edge.text()[-3000:]
        learner.wait_for_output("published weights v1", 120)
        learner.kill(signal.SIGTERM, timeout_s=120)  # torchrun forwards it to both ranks
    finally:
        for proc in _STARTED:
            if proc.popen.poll() is None:
                proc.popen.kill()
                proc.popen.wait(10)
    text = learner.text()
    final = int(text.split("learner stopped at update ")[-1].split()[0])
    assert f"rank 1: stopped after {final} updates" in text  # the follower did every update rank 0 did
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == f"step-{final:08d}" and final >= 3


# ---------------------------------------------------------------- the rank worker


def extra_state(trainer: Trainer) -> dict[str, torch.Tensor]:
    """The algorithm's critics (and their targets) as one flat state dict."""
    return {f"{name}.{key}": tensor.detach().contiguous() for name, module in trainer.algorithm.extra_modules().items()
            for key, tensor in module.state_dict().items()}


def rank_policy(rank: int, lerobot_dir: str | None):
    """Each rank starts from other weights (DDP must broadcast rank 0's); a LeRobot policy from its directory."""
    if lerobot_dir is None:
        return tiny_policy(seed=rank)
    from robot_rl.policies.lerobot_adapter import LeRobotChunkPolicy
    from robot_rl.policies.trainable import StateOffsets

    policy = LeRobotChunkPolicy.from_pretrained(lerobot_dir, device="cpu", state_offsets=StateOffsets(2))
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(rank)
    return policy


# The runs of one torchrun (one process group). One sharded run per process: a second trainer thread
# that shards in the same process crashes inside torch's DTensor (torch 2.11, CPU); a learner has one.
RUN_GROUPS = {"ddp+fsdp": ["bc", "awr", "rl", "act", "fsdp"], "fsdp-act": ["fsdp-act"]}


def worker(out: Path, act_dir: str, group: str) -> None:
    from robot_rl.learner.ddp import init_distributed, shutdown_distributed

    ctx = init_distributed("cpu", timeout_s=120)
    assert ctx is not None and ctx.world_size == 2, "run me under torchrun --nproc-per-node 2"
    for run in RUN_GROUPS[group]:
        algorithm = run if run in ALGORITHMS else "bc"
        train(out / run, ctx, algorithm, act_dir if run.endswith("act") else None,
              parallel="fsdp" if run.startswith("fsdp") else "ddp")
    shutdown_distributed()


def train(out: Path, ctx, algorithm: str, lerobot_dir: str | None, parallel: str = "ddp") -> None:
    """One data-parallel run of UPDATES updates; what each rank ends with goes under ``out``."""
    from torch.distributed.tensor import DTensor

    from robot_rl.learner.ddp import DistributedTrainer
    from robot_rl.learner.index import SamplingIndex
    from tests.learner_helpers import CAMERAS
    from tests.test_learner_trainer import filled_index

    out.mkdir(exist_ok=True)
    index = filled_index() if ctx.is_leader else SamplingIndex(CAMERAS)
    published: list[int] = []
    losses: list[float] = []
    trainer = DistributedTrainer(rank_policy(ctx.rank, lerobot_dir), index, ddp_trainer_config(out, ctx.rank, parallel),
                                 ALGORITHMS[algorithm], ctx, publish=lambda blob: published.append(blob.version))
    update = trainer.update_or_skip  # (sharded, the algorithm is built anew over the shards at the first update)
    trainer.update_or_skip = lambda batch: _record(update(batch), losses)  # this rank's shard loss
    if ctx.is_leader:
        trainer.start()
        assert trainer.wait(180), "leader did not finish its updates"
    else:
        trainer.follow()
    report = {"published": published, "steps": trainer.step, "losses": losses}
    if trainer.sharded:  # rank 0 has the whole weights as it last gathered them; each rank its slices
        report["params"] = sum(p.numel() for p in trainer.policy.parameters())
        report["local_params"] = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel()  # scalars: whole
                                     for p in trainer.policy.parameters())
    weights = trainer.deployed if trainer.sharded else trainer.policy
    if ctx.is_leader or not trainer.sharded:
        save_file({k: v.contiguous() for k, v in weights.state_dict().items()},
                  str(out / f"rank{ctx.rank}.policy.safetensors"))
    save_file(extra_state(trainer), str(out / f"rank{ctx.rank}.extra.safetensors"))
    (out / f"rank{ctx.rank}.json").write_text(json.dumps(report))


def _record(metrics: dict | None, losses: list[float]) -> dict | None:
    losses.append(float("nan") if metrics is None else metrics["loss"])  # None: a skipped (non-finite) batch
    return metrics


if __name__ == "__main__":
    torch.set_num_threads(1)
    worker(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
