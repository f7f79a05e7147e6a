"""Ctrl-C on `robot-rl learner` in a terminal: SIGINT reaches its whole process group (the learner and
its dataset writer), and the learner ends with its closing line, exit 0 and no traceback of its own,
whether the signal comes while the policy loads or while the writer is busy with acked episodes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from robot_rl.bridges.zmq.streaming import StreamingClient
from tests.learner_helpers import client_config, make_steps, tiny_policy, wait_for

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parent.parent
ENDPOINTS = re.compile(r"segments on (\S+), weights on (\S+);")


class Learner:
    """`robot-rl learner` in a process group of its own, as a shell starts it; its output read as it comes."""

    def __init__(self, tmp_path: Path, *overrides: str) -> None:
        tiny_policy().save_pretrained(tmp_path / "policy")
        command = [sys.executable, "-m", "robot_rl.cli", "learner", f"policy.path={tmp_path / 'policy'}",
                   f"output_dir={tmp_path / 'out'}", "learner.service.router_endpoint=tcp://127.0.0.1:0",
                   "learner.service.pub_endpoint=tcp://127.0.0.1:0", "learner.trainer.device=cpu", *overrides]
        env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
        self.process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        for stream, lines in ((self.process.stdout, self.stdout), (self.process.stderr, self.stderr)):
            threading.Thread(target=lines.extend, args=(stream,), daemon=True).start()

    def wait_for_line(self, lines: list[str], found: Callable[[str], bool], what: str) -> str:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = next((line for line in list(lines) if found(line)), None)
            if line is not None:
                return line
            assert self.process.poll() is None, "".join(self.stderr)[-3000:]
            time.sleep(0.01)
        raise AssertionError(f"no {what} in the learner's output")

    def interrupt_group(self) -> int:
        os.killpg(self.process.pid, signal.SIGINT)  # what Ctrl-C in its terminal does
        return self.process.wait(120)


def own_tracebacks(stderr: str) -> list[str]:
    """The tracebacks in ``stderr`` that are not the dataset writer's (a child process, whose own handling of
    Ctrl-C is the store's) nor the store's report that the writer went away."""
    blocks = re.split(r"(?=Traceback \(most recent call last\):)", stderr)[1:]
    writer = ("multiprocessing/", "store_writer.py")
    return [block for block in blocks if not any(mark in block for mark in writer)]


def test_ctrl_c_while_the_policy_loads_stops_cleanly(tmp_path):
    learner = Learner(tmp_path)
    learner.wait_for_line(learner.stderr, lambda line: "learner starts from" in line, "start line")
    code = learner.interrupt_group()
    time.sleep(0.2)  # the readers take the last lines
    out, err = "".join(learner.stdout), "".join(learner.stderr)
    assert code == 0, err[-3000:]
    assert "learner stopped" in out.splitlines()[-1] and "Traceback" not in err


def test_ctrl_c_while_the_writer_is_busy_ends_with_the_closing_line(tmp_path):
    learner = Learner(tmp_path, "learner.store.commit_linger_s=0", "learner.store.commit_batch=1")
    up = learner.wait_for_line(learner.stdout, ENDPOINTS.search, "'learner up' line")
    router, pub = ENDPOINTS.search(up).groups()

    class Endpoints:
        router_endpoint, pub_endpoint = router, pub

    features = {"fps": 30, "joint_names": [f"j{i}" for i in range(6)], "cameras": {"front": [16, 16]}}
    link = StreamingClient(client_config("arm", Endpoints, tmp_path / "spool", features=features))
    link.start()
    try:
        for episode in range(12):
            link.submit_steps(episode, make_steps(30, episode=episode), episode_done=True)
        wait_for(lambda: link.flush(0.05), timeout_s=120, what="every episode acked")
        learner.wait_for_line(learner.stderr, lambda line: "dataset writer process" in line, "the writer's start")
        code = learner.interrupt_group()
    finally:
        link.stop()
    time.sleep(0.2)
    out, err = "".join(learner.stdout), "".join(learner.stderr)
    assert code == 0, err[-3000:]
    assert out.splitlines()[-1].startswith("learner stopped at update"), out
    assert not own_tracebacks(err), own_tracebacks(err)[0]
