"""`robot-rl learner [--resume] [--no-train] OVERRIDES`: the learner service.

Binds the wire server (ROUTER for segments/acks/weight fetches, PUB for announcements),
stores every streamed step exactly once, trains concurrently and publishes weights.
Ctrl-C stops it cleanly with a final checkpoint; ``--resume`` continues from the latest.
"""

from __future__ import annotations

import argparse
import logging
import threading

log = logging.getLogger(__name__)


def build_policy(cfg, init_checkpoint: str | None):  # noqa: ANN001, ANN201 - DictConfig in, FlowVLA out
    """The learner's policy: the init checkpoint if given, else a fresh FlowVLA from ``policy``."""
    from policies.flow_vla import FlowVLA, FlowVLAConfig
    from robot_rl.config import to_dataclass

    if init_checkpoint:
        return FlowVLA.from_pretrained(init_checkpoint)
    policy_node = cfg.get("policy") if cfg is not None else None
    fields = {k for k in FlowVLAConfig.__dataclass_fields__}
    raw = {k: v for k, v in (dict(policy_node) if policy_node is not None else {}).items() if k in fields}
    return FlowVLA(to_dataclass(raw, FlowVLAConfig))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="robot-rl learner", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    parser.add_argument("--no-train", action="store_true", help="only ingest (no trainer thread)")
    args, overrides = parser.parse_known_args(argv)
    from robot_rl.config import load_config
    from robot_rl.learner.config import learner_config_from
    from robot_rl.learner.service import LearnerService

    cfg = load_config(overrides)
    config = learner_config_from(cfg.get("learner"))
    policy = build_policy(cfg, config.init_checkpoint)
    service = LearnerService(config, policy, resume=args.resume, train=not args.no_train).start()
    print(f"learner up: segments on {service.router_endpoint}, weights on {service.pub_endpoint}; Ctrl-C to stop")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        print("stopping: final checkpoint, then closing the store")
    finally:
        service.stop()
    return 0
