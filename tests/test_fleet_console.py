"""The fleet console in-process, over real HTTP: the learner's robots (with what their heartbeats
report) and versions in its state and its event stream; every control refused without the token,
with a wrong one, or on a read-only console, and carried out with it; settings that would expose the
fleet or name a missing token file refused before anything is served."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import replace

import pytest

from robot_rl.bridges.zmq.streaming import StreamingClient
from robot_rl.commands.keys import write_console_token
from robot_rl.core.errors import ConfigError
from robot_rl.learner.config import ConsoleConfig
from robot_rl.learner.console import FleetConsole
from robot_rl.learner.service import LearnerService
from tests.learner_helpers import client_config, learner_config, tiny_policy, wait_for

pytestmark = pytest.mark.timeout(120)


def request(url: str, body: dict | None = None, token: str | None = None) -> tuple[int, dict]:
    """(HTTP status, JSON answer) of a GET, or of a POST when ``body`` is given."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    data = json.dumps(body).encode() if body is not None else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.fixture
def learner(tmp_path):
    token = write_console_token(tmp_path / "console.token")
    config = learner_config(tmp_path / "learner")
    config.console = ConsoleConfig(port=0, token_file=str(token), refresh_s=0.1)
    service = LearnerService(config, tiny_policy(), train=False).start()
    link = StreamingClient(client_config("arm", service, tmp_path / "spool"))
    link.report = lambda: {"late_ticks": 3, "lateness_p99_ms": 1.5, "episode": 7}
    link.start()
    try:
        yield service, token.read_text().strip()
    finally:
        link.stop()
        service.stop(checkpoint=False)


def test_the_state_lists_robots_with_their_heartbeats_and_the_published_versions(learner):
    service, _token = learner
    url = service.console.url
    wait_for(lambda: request(f"{url}/api/state")[1]["robots"][:1] != [] and
             request(f"{url}/api/state")[1]["robots"][0]["late_ticks"] == 3, what="the robot's heartbeat")
    _, state = request(f"{url}/api/state")
    (robot,) = state["robots"]
    assert robot["id"] == "arm" and robot["connected"] and robot["episode"] == 7 and robot["lateness_p99_ms"] == 1.5
    assert robot["pinned"] is None and robot["success"] == {"n": 0, "rate": None, "ci95": None}
    assert [v["version"] for v in state["versions"]] == [0] and state["versions"][0]["servable"]
    assert state["learner"]["controls"] and state["learner"]["training"] is False
    with urllib.request.urlopen(url, timeout=10) as page:
        assert "robot_rl fleet console" in page.read().decode()
    with urllib.request.urlopen(f"{url}/api/events", timeout=10) as events:  # server-sent events
        line = events.readline().decode()
    assert line.startswith("data: ") and json.loads(line[6:])["robots"][0]["id"] == "arm"


def test_controls_need_the_token_and_do_what_they_say(learner, tmp_path):
    service, token = learner
    url = service.console.url
    assert request(f"{url}/api/training", {"paused": True})[0] == 401
    assert request(f"{url}/api/training", {"paused": True}, token="guess")[0] == 403
    assert not service.trainer.paused
    status, answer = request(f"{url}/api/training", {"paused": True}, token=token)
    assert status == 200 and service.trainer.paused and "paused" in answer["done"]
    assert request(f"{url}/api/training", {"paused": False}, token=token)[0] == 200 and not service.trainer.paused
    assert request(f"{url}/api/training", {"paused": "yes"}, token=token)[0] == 400

    wait_for(lambda: "arm" in service.robots, what="the robot's hello")
    assert request(f"{url}/api/pin", {"robot": "arm", "version": 0})[0] == 401
    assert request(f"{url}/api/pin", {"robot": "arm", "version": 0}, token=token)[0] == 200
    assert service.pinned_version("arm") == 0
    status, answer = request(f"{url}/api/pin", {"robot": "ghost", "version": 0}, token=token)
    assert status == 400 and "no robot 'ghost'" in answer["error"]
    status, answer = request(f"{url}/api/fleet", {"version": 99}, token=token)
    assert status == 400 and "not served" in answer["error"]
    assert request(f"{url}/api/fleet", {"version": 0}, token=token)[0] == 200 and service.fleet_pin == 0
    assert service.pinned_version("arm") == 0  # a rollback clears the robot's own pin, the fleet's holds

    read_only = FleetConsole(service, ConsoleConfig(port=0))
    read_only.start()
    try:
        status, answer = request(f"{read_only.url}/api/training", {"paused": True}, token=token)
        assert status == 403 and "read-only" in answer["error"] and not service.trainer.paused
    finally:
        read_only.stop()


def test_settings_that_would_expose_the_fleet_or_name_no_token_are_refused(learner, tmp_path):
    service, _ = learner
    with pytest.raises(ConfigError, match="ssh -L 8765:127.0.0.1:8765"):
        FleetConsole(service, ConsoleConfig(host="0.0.0.0"))
    with pytest.raises(ConfigError, match="robot-rl keys"):
        FleetConsole(service, ConsoleConfig(token_file=str(tmp_path / "missing.token")))
    with pytest.raises(ValueError, match="tls_cert and tls_key"):
        replace(ConsoleConfig(), tls_cert="cert.pem").__post_init__()
    assert (tmp_path / "console.token").stat().st_mode & 0o777 == 0o600


def test_the_live_curve_counts_a_rescued_success_as_none_of_the_policys_and_thins_long_runs():
    from robot_rl.learner.fleet import CURVE_POINTS, CURVE_WINDOW, live_curve
    from robot_rl.learner.metrics import EpisodeOutcome

    def outcome(i: int, success: bool, takeovers: int) -> EpisodeOutcome:
        return EpisodeOutcome("arm", i, 0, success, 100, 10 * takeovers, takeovers, 0.0)

    curve = live_curve([outcome(0, True, 0), outcome(1, True, 1), outcome(2, False, 0)])
    assert [p["success"] for p in curve] == [1.0, 0.5, round(1 / 3, 4)]  # the rescued success is no success
    assert [p["interventions"] for p in curve] == [0.0, 0.5, round(1 / 3, 4)]
    long = live_curve([outcome(i, i % 2 == 0, 0) for i in range(5000)])
    assert len(long) == CURVE_POINTS and long[0]["episodes"] == 1 and long[-1]["episodes"] == 5000
    assert long[-1]["success"] == 0.5 and CURVE_WINDOW % 2 == 0  # a full window of alternating outcomes
