"""What a newcomer reads first: `robot-rl --help` names every benchmark, `robot-rl learner --help`
names the settings a keyed remote learner needs, and `robot-rl keys` prints the overrides of both
sides, which the configuration then accepts as they are."""

from __future__ import annotations

import shlex

import pytest

from robot_rl import cli
from robot_rl.bench.registry import BENCHMARKS
from robot_rl.config import load_config


def help_text(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 0
    return capsys.readouterr().out


def test_the_top_level_help_names_every_benchmark(capsys):
    text = " ".join(help_text(["--help"], capsys).split())  # argparse wraps the line
    assert all(name in text for name in BENCHMARKS), text


def test_the_learner_help_lists_the_service_console_and_trainer_settings(capsys):
    assert cli.main(["learner", "--help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    listed = {line.split()[0]: line for line in lines if line.startswith("  learner.")}
    assert {"learner.service", "learner.console", "learner.trainer"} <= set(listed)
    text = "\n".join(lines)
    for key in ("secret_key", "robot_keys_dir", "router_endpoint", "token_file", "tls_cert", "checkpoint_dir"):
        assert key in text
    assert "learner.algorithm " not in text  # chosen as its own group (learner/algorithm), listed once


def test_keys_prints_what_the_learner_and_each_robot_are_started_with(tmp_path, capsys):
    assert cli.main(["keys", "--out", str(tmp_path / "keys"), "--robots", "arm-a", "arm-b"]) == 0
    printed = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines() if ": " in line)
    learner = load_config(shlex.split(printed["learner"]))
    assert learner.learner.service.robot_keys_dir == str(tmp_path / "keys" / "robots")
    for robot in ("arm-a", "arm-b"):
        overrides = shlex.split(printed[f"robot {robot}"])
        link = load_config([*overrides, "link.learner=tcp://10.0.0.2:5555"]).link
        client = link.client_config("so101", str(tmp_path))  # loads both keys; refused off loopback without them
        assert client.robot_id == robot and client.curve is not None
