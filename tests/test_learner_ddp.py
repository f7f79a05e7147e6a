"""Data-parallel trainer: 2 CPU ranks (gloo) under torchrun, on loopback.

The same file is the rank worker: ``torchrun -m tests.test_learner_ddp OUT UPDATES``.
Rank 0 holds the data (its ranks start from different initial weights on purpose);
after the updates every rank writes its parameters and what it published/checkpointed.
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

from robot_rl.learner.trainer import Trainer
from tests.learner_helpers import BC, tiny_policy, trainer_config

REPO = Path(__file__).resolve().parents[1]
UPDATES = 4
BATCH = 8


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
def ddp_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp")
    proc = run_torchrun(["-m", "tests.test_learner_ddp", str(out)], timeout_s=240)
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return out


def test_ranks_end_bit_identical(ddp_run):
    rank0, rank1 = load_file(str(ddp_run / "rank0.safetensors")), load_file(str(ddp_run / "rank1.safetensors"))
    assert rank0.keys() == rank1.keys()
    for key in rank0:
        assert torch.equal(rank0[key], rank1[key]), key
    assert not torch.equal(rank0["action_out.weight"], tiny_policy(seed=0).state_dict()["action_out.weight"])


def test_matches_a_single_process_on_the_same_batches(ddp_run, tmp_path):
    """Same parameters and losses as one process on the same batches.

    Elements whose gradient is numerically zero (biases right before a GroupNorm, attention
    key biases: the loss does not depend on them) are left out: AdamW turns float noise
    there into +-lr steps, in one process as much as in two.
    """
    from tests.test_learner_trainer import filled_index

    single = Trainer(tiny_policy(seed=0), filled_index(), ddp_trainer_config(tmp_path, 0), BC)
    params = dict(single.policy.named_parameters())
    loss_free = {name: torch.zeros_like(p, dtype=torch.bool) for name, p in params.items()}
    losses = []
    for _ in range(UPDATES):
        losses.append(single.update_once()["loss"])
        for name, p in params.items():
            loss_free[name] |= p.grad.abs() < 1e-6
    assert sum(int(m.sum()) for m in loss_free.values()) < 0.05 * sum(p.numel() for p in params.values())
    ddp = load_file(str(ddp_run / "rank0.safetensors"))
    for name, p in params.items():
        keep = ~loss_free[name]
        torch.testing.assert_close(ddp[name][keep], p.detach()[keep], rtol=1e-4, atol=1e-5, msg=name)
    for name, buf in single.policy.named_buffers():
        torch.testing.assert_close(ddp[name], buf, msg=name)  # normaliser fitted on rank 0, same on all
    shard_losses = [json.loads((ddp_run / f"rank{r}.json").read_text())["losses"] for r in (0, 1)]
    mean = [(a + b) / 2 for a, b in zip(*shard_losses, strict=True)]
    assert mean == pytest.approx(losses, rel=1e-4)


def test_only_rank_zero_publishes_and_checkpoints(ddp_run):
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


def worker(out: Path) -> None:
    from robot_rl.learner.ddp import DistributedTrainer, init_distributed, shutdown_distributed
    from robot_rl.learner.index import SamplingIndex
    from tests.learner_helpers import CAMERAS
    from tests.test_learner_trainer import filled_index

    ctx = init_distributed("cpu", timeout_s=120)
    assert ctx is not None and ctx.world_size == 2, "run me under torchrun --nproc-per-node 2"
    index = filled_index() if ctx.is_leader else SamplingIndex(CAMERAS)
    published: list[int] = []
    losses: list[float] = []
    trainer = DistributedTrainer(tiny_policy(seed=ctx.rank), index, ddp_trainer_config(out, ctx.rank), BC, ctx,
                                 publish=lambda blob: published.append(blob.version))
    update = trainer.algorithm.update
    trainer.algorithm.update = lambda batch: _record(update(batch), losses)  # this rank's shard loss
    if ctx.is_leader:
        trainer.start()
        assert trainer.wait(180), "leader did not finish its updates"
    else:
        trainer.follow()
    save_file({k: v.contiguous() for k, v in trainer.policy.state_dict().items()},
              str(out / f"rank{ctx.rank}.safetensors"))
    report = {"published": published, "steps": trainer.step, "losses": losses}
    (out / f"rank{ctx.rank}.json").write_text(json.dumps(report))
    shutdown_distributed()


def _record(metrics: dict, losses: list[float]) -> dict:
    losses.append(metrics["loss"])
    return metrics


if __name__ == "__main__":
    torch.set_num_threads(1)
    worker(Path(sys.argv[1]))
