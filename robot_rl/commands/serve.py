"""`robot-rl serve`: a policy server for a fleet whose robots have no GPU of their own."""

from __future__ import annotations

import threading

from robot_rl.commands.learner import stop_on_signals

HELP = """\
a policy server: robots started with edge.inference_runner=remote and link.policy_server=ADDRESS
send it what their policy reads (frames at the policy's input size, JPEG) and get chunks back.
Robots that ask within serve.batch_window_ms share one forward (up to serve.max_batch), each with
its own noise generator, so a robot's chunk does not depend on who else asked. It serves the
checkpoint an edge would run (policy.path, else the BC checkpoint, else the shipped one), on
policy.device. Off loopback it needs CURVE keys from `robot-rl keys`: serve.secret_key and
serve.robot_keys_dir (robots then set link.policy_server_key to its public key).

examples:
  robot-rl serve policy.path=outputs/bc_policy policy.device=cuda serve.endpoint=tcp://0.0.0.0:5557 \\
      serve.secret_key=keys/learner.key_secret serve.robot_keys_dir=keys/robots
  robot-rl edge edge.inference_runner=remote link.policy_server=tcp://gpu.lab:5557 \\
      link.policy_server_key=keys/learner.key link.learner=tcp://gpu.lab:5555 ...
"""

# The root config groups this command reads.
GROUPS: tuple[str, ...] = ("policy", "serve")


def main(argv: list[str]) -> int:
    """``argv``: configuration overrides only."""
    from robot_rl.app.policies import load_policy
    from robot_rl.config import load_config
    from robot_rl.learner.serving import PolicyServer

    cfg = load_config(argv)
    server = PolicyServer(load_policy(cfg), cfg.serve).start()
    stop = threading.Event()
    stop_on_signals(stop)
    print(f"serving chunks on {server.endpoint}; Ctrl-C to stop", flush=True)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        server.close()
    print(f"served {server.stats.chunks} chunks in {server.stats.forwards} forwards "
          f"(mean batch {server.stats.mean_batch:.1f}, {server.stats.dropped_late} dropped past their deadline)")
    return 0
