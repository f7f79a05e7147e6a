"""Data-parallel trainer: 2 CPU ranks (gloo) under torchrun, on loopback.

The same file is the rank worker: ``torchrun -m tests.test_learner_ddp OUT ACT_DIR`` trains one
tiny FlowVLA per algorithm, then the LeRobot ACT in ACT_DIR, one after the other in one process
group (one start-up). Rank 0 holds the data (the ranks start from different initial weights on
purpose); after each run every rank writes its parameters, its critics and what it published and
checkpointed under OUT/RUN.
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


def ddp_trainer_config(root: Path, rank: int):
    return trainer_config(root / f"ckpt-rank{rank}", batch_size=BATCH, publish_every_updates=2,
                          checkpoint_every_updates=2, max_updates=UPDATES)


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
    proc = run_torchrun(["-m", "tests.test_learner_ddp", str(out), str(act)], timeout_s=400)
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
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


def test_matches_a_single_process_on_the_same_batches(ddp_run, tmp_path):
    """Same parameters, critics and losses as one process on the same batches.

    Elements whose gradient is numerically zero (biases right before a GroupNorm, attention
    key biases: the loss does not depend on them) are left out: AdamW turns float noise
    there into +-lr steps, in one process as much as in two.
    """
    from tests.test_learner_trainer import filled_index

    name, ddp_run = ddp_run
    single = Trainer(tiny_policy(seed=0), filled_index(), ddp_trainer_config(tmp_path, 0), ALGORITHMS[name])
    params = dict(single.policy.named_parameters())
    loss_free = {name: torch.zeros_like(p, dtype=torch.bool) for name, p in params.items()}
    losses = []
    for _ in range(UPDATES):
        losses.append(single.update_once()["loss"])
        for name, p in params.items():
            loss_free[name] |= p.grad.abs() < 1e-6
    assert sum(int(m.sum()) for m in loss_free.values()) < 0.05 * sum(p.numel() for p in params.values())
    ddp = load_file(str(ddp_run / "rank0.policy.safetensors"))
    for key, p in params.items():
        keep = ~loss_free[key]
        torch.testing.assert_close(ddp[key][keep], p.detach()[keep], rtol=1e-4, atol=1e-5, msg=key)
    for key, buf in single.policy.named_buffers():
        torch.testing.assert_close(ddp[key], buf, msg=key)  # normaliser fitted on rank 0, same on all
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


def worker(out: Path, act_dir: str) -> None:
    from robot_rl.learner.ddp import init_distributed, shutdown_distributed

    ctx = init_distributed("cpu", timeout_s=120)
    assert ctx is not None and ctx.world_size == 2, "run me under torchrun --nproc-per-node 2"
    for algorithm in sorted(ALGORITHMS):
        train(out / algorithm, ctx, algorithm, None)
    train(out / "act", ctx, "bc", act_dir)
    shutdown_distributed()


def train(out: Path, ctx, algorithm: str, lerobot_dir: str | None) -> None:
    """One data-parallel run of UPDATES updates; what each rank ends with goes under ``out``."""
    from robot_rl.learner.ddp import DistributedTrainer
    from robot_rl.learner.index import SamplingIndex
    from tests.learner_helpers import CAMERAS
    from tests.test_learner_trainer import filled_index

    out.mkdir(exist_ok=True)
    index = filled_index() if ctx.is_leader else SamplingIndex(CAMERAS)
    published: list[int] = []
    losses: list[float] = []
    trainer = DistributedTrainer(rank_policy(ctx.rank, lerobot_dir), index, ddp_trainer_config(out, ctx.rank),
                                 ALGORITHMS[algorithm], ctx, publish=lambda blob: published.append(blob.version))
    update = trainer.algorithm.update
    trainer.algorithm.update = lambda batch: _record(update(batch), losses)  # this rank's shard loss
    if ctx.is_leader:
        trainer.start()
        assert trainer.wait(180), "leader did not finish its updates"
    else:
        trainer.follow()
    save_file({k: v.contiguous() for k, v in trainer.policy.state_dict().items()},
              str(out / f"rank{ctx.rank}.policy.safetensors"))
    save_file(extra_state(trainer), str(out / f"rank{ctx.rank}.extra.safetensors"))
    report = {"published": published, "steps": trainer.step, "losses": losses}
    (out / f"rank{ctx.rank}.json").write_text(json.dumps(report))


def _record(metrics: dict, losses: list[float]) -> dict:
    losses.append(metrics["loss"])
    return metrics


if __name__ == "__main__":
    torch.set_num_threads(1)
    worker(Path(sys.argv[1]), sys.argv[2])
