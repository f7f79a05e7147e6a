"""`robot-rl learner [--resume] [--no-train] OVERRIDES`: the learner service.

Binds the wire server (ROUTER for segments/acks/weight fetches, PUB for announcements),
stores every streamed step exactly once, trains concurrently and publishes weights.
Ctrl-C or SIGTERM stops it cleanly with a final checkpoint; ``--resume`` continues from the latest.

Data-parallel on several GPUs (or CPU processes, gloo): launch the same command under torchrun,
``torchrun --nproc-per-node 2 -m robot_rl.cli learner OVERRIDES``. Rank 0 is the learner the
robots talk to; the other ranks only train (``robot_rl.learner.ddp``). ``trainer.batch_size`` is
the global batch and must divide by the number of ranks.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import threading

log = logging.getLogger(__name__)


def build_policy(cfg, init_checkpoint: str | None):  # noqa: ANN001, ANN201 - DictConfig in, FlowVLA out
    """The learner's policy: the init checkpoint if given, else a fresh FlowVLA from ``policy``."""
    from robot_rl.policies.flow_vla import FlowVLA, FlowVLAConfig
    from robot_rl.config import to_dataclass

    if init_checkpoint:
        return FlowVLA.from_pretrained(init_checkpoint)
    policy_node = cfg.get("policy") if cfg is not None else None
    fields = {k for k in FlowVLAConfig.__dataclass_fields__}
    raw = {k: v for k, v in (dict(policy_node) if policy_node is not None else {}).items() if k in fields}
    return FlowVLA(to_dataclass(raw, FlowVLAConfig))


def stop_on_signals(stop: threading.Event) -> None:
    """SIGINT (Ctrl-C) and SIGTERM (kill, systemd, docker stop, torchrun) both mean: stop cleanly."""
    def handler(signum: int, frame: object) -> None:
        log.info("%s received: stopping with a final checkpoint", signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="robot-rl learner", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    parser.add_argument("--no-train", action="store_true", help="only ingest (no trainer thread)")
    args, overrides = parser.parse_known_args(argv)
    from robot_rl.config import load_config
    from robot_rl.learner.config import learner_config_from
    from robot_rl.learner.ddp import follow_rank, init_distributed, shutdown_distributed
    from robot_rl.learner.service import LearnerService

    cfg = load_config(overrides)
    config = learner_config_from(cfg.get("learner"))
    dist = init_distributed(config.trainer.device)  # None unless launched by torchrun
    try:
        if dist is not None:
            config.trainer = dataclasses.replace(config.trainer, device=str(dist.device))
        policy = build_policy(cfg, config.init_checkpoint)
        if dist is not None and not dist.is_leader:
            steps = follow_rank(config, policy, dist, resume=args.resume)
            print(f"rank {dist.rank}: stopped after {steps} updates")
            return 0
        stop = threading.Event()
        stop_on_signals(stop)
        service = LearnerService(config, policy, resume=args.resume, train=not args.no_train, dist=dist).start()
        ranks = f" ({dist.world_size} data-parallel ranks)" if dist is not None else ""
        print(f"learner up{ranks}: segments on {service.router_endpoint}, weights on {service.pub_endpoint}; "
              "Ctrl-C to stop", flush=True)
        try:
            while not stop.wait(1.0):
                pass
            print("stopping: final checkpoint, then closing the store", flush=True)
        finally:
            service.stop()
        print(f"learner stopped at update {service.trainer.step}", flush=True)
        return 0
    finally:
        shutdown_distributed()
