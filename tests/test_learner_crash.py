"""Real crashes: learner and edge in their own processes, killed with SIGKILL, restarted on their disks.

Exactly once = no (robot, episode, tick) stored twice, every step the edge had made
durable (spooled) before its crash is stored, nothing is stored that was never sent.
Also: ``robot-rl learner`` writes its final checkpoint on SIGTERM.

The same file holds the two process entries (``python -m tests.test_learner_crash``):
``learner OVERRIDES`` runs ``robot_rl.commands.learner.main`` with the tiny test policy;
``edge ...`` streams synthetic steps whose state encodes (robot, episode, tick).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest

from tests.learner_helpers import IMG, JOINTS, wait_for

pytestmark = pytest.mark.slow  # processes end to end: started first when the suite runs in parallel

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
STEPS_PER_EPISODE = 120  # long episodes: each LeRobot episode commit costs ~1-2 s here
SEGMENT_STEPS = 10
STEP_PERIOD_S = 1 / 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_STARTED: list[Proc] = []


@pytest.fixture(autouse=True)
def _no_leftover_processes():
    """A failed assertion must not leave a learner or an edge running."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait(10)


class Proc:
    """A child process whose output goes to a file we can poll (bounded waits only)."""

    def __init__(self, name: str, args: list[str], logs: Path, launcher: tuple[str, ...] = ()) -> None:
        """Runs ``python [launcher...] -m tests.test_learner_crash args``."""
        self.log = logs / f"{name}.log"
        self._out = open(self.log, "w")  # noqa: SIM115 - closed in finish()
        self.popen = subprocess.Popen([sys.executable, *launcher, "-m", "tests.test_learner_crash", *args], cwd=REPO,
                                      env=ENV, stdout=self._out, stderr=subprocess.STDOUT)
        _STARTED.append(self)

    def text(self) -> str:
        return self.log.read_text()

    def wait_for_output(self, needle: str, timeout_s: float) -> None:
        wait_for(lambda: needle in self.text() or self.popen.poll() is not None, timeout_s, f"{needle!r} in {self.log}")
        assert needle in self.text(), f"{self.log.name} exited ({self.popen.returncode}) early:\n{self.text()[-3000:]}"

    def kill(self, sig: int = signal.SIGKILL, timeout_s: float = 60) -> int:
        self.popen.send_signal(sig)
        return self.finish(timeout_s)

    def finish(self, timeout_s: float) -> int:
        try:
            rc = self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(10)
            raise AssertionError(f"{self.log.name} did not exit within {timeout_s} s:\n{self.text()[-3000:]}") from None
        self._out.close()
        return rc


def learner_overrides(root: Path, router: int, pub: int, **extra: object) -> list[str]:
    base = {
        "learner": "bc",  # plain BC trains on the synthetic online steps (hgdagger, the default, waits for corrections)
        "learner.store.root": root / "store", "learner.store.joint_names": "[" + ",".join(JOINTS) + "]",
        "learner.store.cameras": "[front]", "learner.store.image_height": IMG, "learner.store.image_width": IMG,
        "learner.store.episode_timeout_s": 1.0, "learner.trainer.checkpoint_dir": root / "ckpt",
        "learner.trainer.device": "cpu", "learner.trainer.batch_size": 4, "learner.trainer.min_steps_to_train": 8,
        "learner.trainer.checkpoint_every_updates": 10**9,  # only the final checkpoint (a tiny net trains fast)
        "learner.trainer.log_dir": "''", "learner.service.router_endpoint": f"tcp://127.0.0.1:{router}",
        "learner.service.pub_endpoint": f"tcp://127.0.0.1:{pub}", "learner.service.heartbeat_interval_s": 0.2,
    }
    return [f"{k}={v}" for k, v in {**base, **extra}.items()]


def edge_args(root: Path, router: int, pub: int, first_episode: int, episodes: int, name: str) -> list[str]:
    return ["edge", f"tcp://127.0.0.1:{router}", f"tcp://127.0.0.1:{pub}", str(root / "spool"), str(first_episode),
            str(episodes), str(root / f"{name}.jsonl")]


def read_log(path: Path) -> tuple[set, set, bool]:
    """(submitted triples, durable triples, flushed) from an edge's progress log (torn last line ignored)."""
    submitted, durable, flushed = set(), set(), False
    for line in (path.read_text() if path.exists() else "").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        triples = {(0, entry.get("episode", -1), t) for t in entry.get("ticks", [])}
        if entry["kind"] == "submitted":
            submitted |= triples
        elif entry["kind"] == "durable":
            durable |= triples
        elif entry["kind"] == "flushed":
            flushed = True
    return submitted, durable, flushed


def stored_steps(store_root: Path) -> list[tuple[int, int, int]]:
    """Every step the store holds (dataset and staged), from a store reopened on that disk."""
    from robot_rl.learner.store import ReplayStore
    from tests.learner_helpers import store_config

    with ReplayStore(store_config(store_root)) as store:
        if not store.index.num_entries:
            return []
        states, _ = store.index.states_and_actions()
    return [tuple(int(v) for v in row[:3]) for row in states]


def test_exactly_once_across_sigkilled_learner_and_edge(tmp_path):
    router, pub = free_port(), free_port()
    learner = Proc("learner1", ["learner", "--no-train", *learner_overrides(tmp_path, router, pub)], tmp_path)
    learner.wait_for_output("learner up", 120)
    edge = Proc("edge1", edge_args(tmp_path, router, pub, first_episode=1, episodes=0, name="edge1"), tmp_path)
    wait_for(lambda: len(read_log(tmp_path / "edge1.jsonl")[1]) >= 60, 90, "edge 1 to make 60 steps durable")

    assert learner.kill(signal.SIGKILL) == -signal.SIGKILL  # mid-stream
    durable_before = len(read_log(tmp_path / "edge1.jsonl")[1])
    wait_for(lambda: len(read_log(tmp_path / "edge1.jsonl")[1]) >= durable_before + 30, 60,
             "edge 1 to keep recording while the learner is down")
    learner = Proc("learner2", ["learner", "--no-train", *learner_overrides(tmp_path, router, pub)], tmp_path)
    learner.wait_for_output("learner up", 120)
    durable_before = len(read_log(tmp_path / "edge1.jsonl")[1])
    wait_for(lambda: len(read_log(tmp_path / "edge1.jsonl")[1]) >= durable_before + 30, 60,
             "edge 1 to stream to the restarted learner")
    wait_for(lambda: len(read_log(tmp_path / "edge1.jsonl")[0]) % STEPS_PER_EPISODE not in (0, SEGMENT_STEPS), 20,
             "edge 1 to be in the middle of an episode")
    assert edge.kill(signal.SIGKILL) == -signal.SIGKILL  # mid-episode

    edge = Proc("edge2", edge_args(tmp_path, router, pub, first_episode=1000, episodes=2, name="edge2"), tmp_path)
    assert edge.finish(120) == 0, edge.text()[-3000:]
    assert learner.kill(signal.SIGTERM, timeout_s=180) == 0, learner.text()[-3000:]

    submitted1, durable1, _ = read_log(tmp_path / "edge1.jsonl")
    submitted2, durable2, flushed2 = read_log(tmp_path / "edge2.jsonl")
    assert flushed2 and submitted2 == durable2 and len(submitted2) == 2 * STEPS_PER_EPISODE
    stored = stored_steps(tmp_path / "store")
    assert len(stored) == len(set(stored)), "a step was stored twice"
    assert durable1 | submitted2 <= set(stored), sorted(durable1 | submitted2 - set(stored))[:10]
    assert set(stored) <= submitted1 | submitted2, "stored steps that were never sent"
    assert len(durable1) >= 120 and len(set(stored)) >= 120 + 2 * STEPS_PER_EPISODE


def test_learner_writes_its_final_checkpoint_on_sigterm(tmp_path):
    router, pub = free_port(), free_port()
    overrides = learner_overrides(tmp_path, router, pub, **{"learner.trainer.publish_every_updates": 3})
    learner = Proc("learner", ["learner", *overrides], tmp_path)
    learner.wait_for_output("learner up", 120)
    edge = Proc("edge", edge_args(tmp_path, router, pub, first_episode=1, episodes=1, name="edge"), tmp_path)
    assert edge.finish(120) == 0, edge.text()[-3000:]
    learner.wait_for_output("published weights v1", 120)  # it has trained
    assert not list((tmp_path / "ckpt").glob("step-*"))  # none yet: checkpoint_every_updates is far away
    assert learner.kill(signal.SIGTERM, timeout_s=120) == 0, learner.text()[-3000:]
    final = learner.text().split("learner stopped at update ")[-1].split()[0]
    latest = (tmp_path / "ckpt" / "latest").read_text().strip()
    assert latest == f"step-{int(final):08d}" and int(final) >= 3
    assert json.loads((tmp_path / "ckpt" / latest / "trainer.json").read_text())["step"] == int(final)


# ---------------------------------------------------------------- process entries


def run_learner(overrides: list[str]) -> int:
    import logging

    import robot_rl.app.policies as policies
    import robot_rl.commands.learner as command
    from tests.learner_helpers import tiny_policy

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    policies.learner_policy = lambda config: tiny_policy()  # offline text encoder, tiny net
    return command.main(overrides)


def run_edge(router: str, pub: str, spool: str, first_episode: int, episodes: int, log_path: str) -> int:
    """Stream episodes of synthetic steps at ~60 steps/s; log what was submitted and what is durable.

    ``episodes=0``: forever (until killed). A segment is durable once the link has spooled it
    (fsynced); segments are spooled in submission order, so the count says which.
    """
    from robot_rl.bridges.zmq.client import ClientConfig
    from robot_rl.bridges.zmq.segments import ImageEncoding
    from robot_rl.bridges.zmq.streaming import StreamingClient
    from tests.learner_helpers import make_step, robot_features, tiny_policy

    config = ClientConfig(robot_id="r0", router_endpoint=router, pub_endpoint=pub, spool_dir=spool,
                          features=robot_features(),
                          config_hash=tiny_policy().config_hash(), heartbeat_interval_s=0.2, hello_retry_s=0.1,
                          ack_timeout_s=2.0, server_timeout_s=2.0, fetch_weights=False)
    out = open(log_path, "a", buffering=1)  # noqa: SIM115 - line-buffered progress log, lives with the process
    link = StreamingClient(config, image_encoding=ImageEncoding("png")).start()
    waiting: list[dict] = []  # submitted, not yet known durable

    def note_durable() -> None:
        spooled = int(link.stats().get("segments_spooled", 0))
        while waiting and waiting[0]["n"] < spooled:
            entry = waiting.pop(0)
            out.write(json.dumps({"kind": "durable", "episode": entry["episode"], "ticks": entry["ticks"]}) + "\n")

    count, episode = 0, first_episode
    while episodes == 0 or episode < first_episode + episodes:
        steps = [make_step(t, episode=episode, done=t == STEPS_PER_EPISODE - 1) for t in range(STEPS_PER_EPISODE)]
        for start in range(0, STEPS_PER_EPISODE, SEGMENT_STEPS):
            chunk = steps[start:start + SEGMENT_STEPS]
            entry = {"kind": "submitted", "episode": episode, "ticks": [s.tick for s in chunk], "n": count}
            out.write(json.dumps({k: v for k, v in entry.items() if k != "n"}) + "\n")
            while not link.submit_steps(episode, chunk, episode_done=chunk[-1].done):
                time.sleep(0.01)  # queue full: keep the segment, offer it again (never dropped)
            waiting.append(entry)
            count += 1
            for _ in range(SEGMENT_STEPS):
                time.sleep(STEP_PERIOD_S)
                note_durable()
        episode += 1
    flushed = link.flush(90.0)
    note_durable()
    if flushed:
        out.write(json.dumps({"kind": "flushed"}) + "\n")
    link.stop()
    return 0 if flushed else 3


if __name__ == "__main__":
    np.seterr(all="raise")
    role, args = sys.argv[1], sys.argv[2:]
    if role == "learner":
        sys.exit(run_learner(args))
    sys.exit(run_edge(args[0], args[1], args[2], int(args[3]), int(args[4]), args[5]))
