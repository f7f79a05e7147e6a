"""`robot-rl learner [--resume] [--no-train] OVERRIDES`: the learner service.

Binds the wire server (ROUTER for segments/acks/weight fetches, PUB for announcements),
stores every streamed step exactly once, trains concurrently and publishes weights.
Ctrl-C or SIGTERM stops it cleanly with a final checkpoint; ``--resume`` continues from the latest.

Data-parallel on several GPUs (or CPU processes, gloo): launch the same command under torchrun,
``torchrun --nproc-per-node 2 -m robot_rl.cli learner OVERRIDES``. Rank 0 is the learner the
robots talk to; the other ranks only train (``robot_rl.learner.ddp``). ``learner.trainer.batch_size`` is
the global batch and must divide by the number of ranks. ``learner.trainer.parallel=fsdp`` shards the
model over the ranks instead of copying it, for one that does not fit a device with its optimiser
(``robot_rl.learner.fsdp``).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import threading

log = logging.getLogger(__name__)

HELP = """the learner service: stores every step the edge nodes stream exactly once, trains the policy
with the learner's algorithm and publishes its weights. Flags: --resume continues from the latest
checkpoint in learner.trainer.checkpoint_dir; --no-train only ingests. It starts from
learner.init_checkpoint, else the checkpoint an edge would run (policy.path, else the BC
checkpoint, else the shipped one), else a new model of policy.model. Joints, cameras and image
sizes come from the policy and from the robots' hellos: no robot settings are needed. It serves the
fleet console (its address is printed; learner.console.*; controls with the token robot-rl keys
writes, learner.console.token_file=keys/console.token) and logs to TensorBoard beside its
checkpoints (tensorboard --logdir OUTPUT_DIR/learner).

  robot-rl learner learner=rwr learner.algorithm.beta=0.25
  robot-rl learner --resume learner.service.router_endpoint=tcp://0.0.0.0:5555 \\
      learner.service.secret_key=keys/learner.key_secret learner.service.robot_keys_dir=keys/robots
  torchrun --nproc-per-node 2 -m robot_rl.cli learner learner.trainer.batch_size=64"""
GROUPS: tuple[str, ...] = ("policy", "learner", "learner/algorithm")


def stop_on_signals(stop: threading.Event) -> None:
    """SIGINT (Ctrl-C) and SIGTERM (kill, systemd, docker stop, torchrun) both mean: stop cleanly.
    Installed before the slow start (configuration, policy, store), so a Ctrl-C then stops as cleanly
    as one later: no KeyboardInterrupt lands in the middle of whatever the main thread is doing."""
    def handler(signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if stop.is_set():
            log.info("%s received: already stopping (final checkpoint, then the store); it ends with "
                     "'learner stopped'", name)
        else:
            log.info("%s received: stopping with a final checkpoint", name)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="robot-rl learner", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    parser.add_argument("--no-train", action="store_true", help="only ingest (no trainer thread)")
    args, overrides = parser.parse_known_args(argv)
    stop = threading.Event()
    stop_on_signals(stop)
    from robot_rl.app.preflight import check_learner_files
    from robot_rl.config import load_config

    root = load_config(overrides)
    check_learner_files(root, resume=args.resume)  # before the imports below, which take ~10 s

    from robot_rl.app.policies import learner_policy
    from robot_rl.learner.console import console_line
    from robot_rl.learner.ddp import follow_rank, init_distributed, shutdown_distributed
    from robot_rl.learner.service import LearnerService
    from robot_rl.learner.serving import serve_from_learner

    config = root.learner
    dist = init_distributed(config.trainer.device)  # None unless launched by torchrun
    try:
        if dist is not None:
            config.trainer = dataclasses.replace(config.trainer, device=str(dist.device))
        policy = learner_policy(root)
        if dist is not None and not dist.is_leader:
            steps = follow_rank(config, policy, dist, resume=args.resume)
            print(f"rank {dist.rank}: stopped after {steps} updates")
            return 0
        if stop.is_set():
            print("learner stopped before it started", flush=True)
            return 0
        service = LearnerService(config, policy, resume=args.resume, train=not args.no_train, dist=dist)
        serving = serve_from_learner(service, root.serve) if config.serve_policy else None  # before any publish
        service.start()
        ranks = f" ({dist.world_size} data-parallel ranks)" if dist is not None else ""
        print(f"learner up{ranks}: segments on {service.router_endpoint}, weights on {service.pub_endpoint}; "
              "Ctrl-C to stop", flush=True)
        if service.console is not None:
            print(console_line(service.console), flush=True)
        if serving is not None:
            print(f"serving chunks on {serving.endpoint} (edge.inference_runner=remote link.policy_server=...)",
                  flush=True)
        try:
            while not stop.wait(1.0):
                pass
            print("stopping: final checkpoint, then closing the store", flush=True)
        finally:
            if serving is not None:
                serving.close()
            service.stop()
        print(f"learner stopped at update {service.trainer.step}", flush=True)
        return 0
    finally:
        shutdown_distributed()
