"""`robot-rl keys`: generate CURVE key pairs for the learner and its robots."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = """\
CURVE key pairs for the learner and its robots (the wire refuses plain TCP off loopback).

Options: --out DIR (default keys/), --robots NAME ... (default robot-0), --no-learner (only robot
keys, to add robots to an existing set), --force (replace existing keys). Layout written:

    keys/learner.key          learner public key   -> copy to every robot (link.learner_key)
    keys/learner.key_secret   learner secret key   -> stays on the learner (learner.service.secret_key)
    keys/robots/NAME.key      robot public keys    -> the learner's allow-list (learner.service.robot_keys_dir)
                                                   (NAME is the robot id that key may use: link.robot_id=NAME)
    keys/robots/NAME.key_secret                    -> copy to robot NAME only (link.secret_key)
    keys/console.token        the fleet console's controls (learner.console.token_file; with the learner)

examples:
  robot-rl keys --robots so101-a so101-b
  robot-rl keys --no-learner --robots so101-c
"""

# Only flags: this command reads no configuration.
GROUPS: tuple[str, ...] = ()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="robot-rl keys", description=HELP,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("keys"), help="directory to write keys into")
    parser.add_argument("--robots", nargs="*", default=["robot-0"], help="robot ids to make key pairs for")
    parser.add_argument("--no-learner", action="store_true", help="only robot keys (add robots to an existing set)")
    parser.add_argument("--force", action="store_true", help="overwrite existing key files")
    args = parser.parse_args(argv)
    from robot_rl.bridges.zmq.keys import generate_keypair

    wanted = ([] if args.no_learner else [(args.out, "learner")]) + [(args.out / "robots", r) for r in args.robots]
    existing = [d / f"{n}.key_secret" for d, n in wanted if (d / f"{n}.key_secret").exists()]
    if existing and not args.force:
        print(f"robot-rl keys: {', '.join(map(str, existing))} already exist; pass --force to replace them "
              "(robots and learner holding the old keys will then be refused)")
        return 2
    for directory, name in wanted:
        public, secret = generate_keypair(directory, name)
        print(f"{name:>16}: public {public}  secret {secret} (chmod 600)")
    if not args.no_learner:
        token = write_console_token(args.out / "console.token")
        print(f"learner: {learner_overrides(args.out)} learner.console.token_file={token}")
    for robot in args.robots:
        print(f"robot {robot}: {robot_overrides(args.out, robot)}")
    return 0


def learner_overrides(out: Path) -> str:
    """What the learner is started with to take these robots' keys (and refuse all others)."""
    return f"learner.service.secret_key={out / 'learner.key_secret'} learner.service.robot_keys_dir={out / 'robots'}"


def robot_overrides(out: Path, robot: str) -> str:
    """What robot ``robot`` is started with (its secret key and the learner's public key copied to it):
    the id is the one its key is allowed to stream as."""
    return (f"link.robot_id={robot} link.secret_key={out / 'robots' / f'{robot}.key_secret'} "
            f"link.learner_key={out / 'learner.key'}")


def write_console_token(path: Path) -> Path:
    """256 random bits for the fleet console's controls, readable by the owner only."""
    import os
    import secrets

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_urlsafe(32) + "\n")
    os.chmod(path, 0o600)  # an existing file keeps its old mode through O_CREAT
    return path
