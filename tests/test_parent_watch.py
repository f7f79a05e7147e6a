"""Children the learner and the edge start (the dataset writer, the policy process) end when their
parent is killed (SIGKILL: no clean-up runs), even while busy, so no dataset writer keeps writing
to a dataset a restarted learner opens (robot_rl/core/parent_watch.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parent.parent

PARENT = """
import multiprocessing, sys, time
from robot_rl.core.parent_watch import exit_when_parent_dies


def busy_child(watch):
    if watch:
        exit_when_parent_dies("the test child")
    time.sleep(600)  # a long dataset write or finalize: it reads no pipe and sees no EOF meanwhile


if __name__ == "__main__":
    child = multiprocessing.get_context("spawn").Process(target=busy_child, args=(sys.argv[1] == "watch",))
    child.start()
    print(child.pid, flush=True)
    time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for its reaper is gone too
        return f.read().split(") ")[-1][0] != "Z"


@pytest.mark.parametrize("watch", ["watch", "no-watch"])
def test_a_busy_child_ends_when_the_process_that_started_it_is_killed(tmp_path, watch):
    """The control experiment (no watch) shows the child would live on: nothing else ends it."""
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script), watch], stdout=subprocess.PIPE, text=True, cwd=REPO,
                              env=dict(os.environ, PYTHONPATH=str(REPO)))
    child = int(parent.stdout.readline())
    try:
        time.sleep(1.0)  # the child is running (and, with the watch, watching)
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        deadline = time.monotonic() + (20 if watch == "watch" else 3)  # bounds, not speed checks
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert alive(child) == (watch == "no-watch")
    finally:
        if parent.poll() is None:
            parent.kill()
        if alive(child):
            os.kill(child, signal.SIGKILL)
