"""The fleet console as an operator sees it: a `robot-rl run` (two simulated robots in processes of
their own, a tiny policy) and its console in headless Chromium (Debian's chromium and chromium-driver,
driven by selenium). The page lists both robots with their versions, a newly published version appears
without a reload, a control without the token is refused, and with the token a pin and a fleet rollback
reach the robots: the version they report executing becomes the pinned one. Then the operator presses
Ctrl-C: the run ends its robots' episodes and prints its summary."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from robot_rl.commands.keys import write_console_token
from robot_rl.policies.flow_vla import FlowVLA
from tests.learner_helpers import tiny_policy_config

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parent.parent
CONSOLE_LINE = re.compile(r"fleet console: (http://127\.0\.0\.1:\d+)")


def wait(predicate: Callable[[], object], timeout_s: float, what: str) -> object:
    """Bounded wait for what the page shows (not a timing assertion)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = predicate()
        except AssertionError:  # the predicate saw that waiting longer cannot help
            raise
        except Exception:  # noqa: BLE001 - the page is being redrawn between two reads
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.2)


def start_run(tmp_path: Path, token: Path) -> tuple[subprocess.Popen[str], list[str], threading.Thread]:
    config = tiny_policy_config()
    config.cameras = ("front", "wrist")
    FlowVLA(config).save_pretrained(tmp_path / "policy")
    command = [
        sys.executable, "-m", "robot_rl.cli", "run", f"policy.path={tmp_path / 'policy'}", f"output_dir={tmp_path}",
        "robot.image_height=32", "robot.image_width=32", "demos.episodes=1", "run.num_robots=2", "run.episodes=60",
        # A budget the checks never reach: the test ends the run with Ctrl-C once they are done.
        "run.time_budget_min=6.0", "run.min_updates=null", "run.eval_episodes=0", "run.heldout_scenes=0",
        "run.max_episode_steps=60", "learner.trainer.publish_every_updates=50", "learner.trainer.max_updates=1500",
        "learner.console.port=0", f"learner.console.token_file={token}", "learner.console.refresh_s=0.25",
        # Ports the system picks: another learner on this machine (a run, a benchmark) may hold the defaults.
        "learner.service.router_endpoint=tcp://127.0.0.1:0", "learner.service.pub_endpoint=tcp://127.0.0.1:0",
    ]
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", MUJOCO_GL="egl")
    run = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           stdin=subprocess.DEVNULL)
    lines: list[str] = []
    assert run.stdout is not None
    stdout = run.stdout
    reader = threading.Thread(target=lambda: lines.extend(stdout), daemon=True)
    reader.start()
    return run, lines, reader


def chromium(width: int = 1400) -> object:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 f"--window-size={width},1100"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"))


OFF_SCREEN_PINS = """const width = document.documentElement.clientWidth;
return [...document.querySelectorAll('#robots button.pin, #robots button.unpin')]
  .filter(b => { const r = b.getBoundingClientRect(); return r.width === 0 || r.left < 0 || r.right > width; })
  .map(b => b.dataset.robot)"""


def off_screen_pin_buttons(browser: Any) -> list[str]:
    """Robots whose pin or unpin button lies outside the window as it opens, without scrolling sideways
    (or is hidden); the page itself must not be wider than the window."""
    wider = browser.execute_script("return document.documentElement.scrollWidth > "
                                   "document.documentElement.clientWidth")
    return ["the page is wider than the window"] if wider else browser.execute_script(OFF_SCREEN_PINS)


@pytest.mark.slow
def test_an_operator_watches_the_fleet_and_pins_and_rolls_back_with_the_token(tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    token_file = write_console_token(tmp_path / "console.token")
    run, lines, reader = start_run(tmp_path, token_file)
    browser = None
    try:
        def console_address() -> str | None:
            assert run.poll() is None, "the run ended before its console was up:\n" + "".join(lines)[-3000:]
            return next((m.group(1) for line in list(lines) if (m := CONSOLE_LINE.search(line))), None)

        url = wait(console_address, 240, "the console's address in the run's output")
        browser = chromium()
        browser.get(str(url))

        def page(script: str) -> object:
            """Read the page in one step (it is redrawn every refresh)."""
            return browser.execute_script(script)

        def running() -> dict[str, int]:
            """Robot -> the version it reports executing, as the page shows it."""
            return {robot: int(text.split()[0].lstrip("v")) for robot, text in page(
                "return [...document.querySelectorAll('#robots tr[data-robot]')]"
                ".map(r => [r.dataset.robot, r.querySelector('td.version').textContent])")}

        def versions() -> list[int]:
            return [int(v) for v in page("return [...document.querySelectorAll('#versions tbody tr')]"
                                         ".map(r => r.dataset.version)")]

        def options(selector: str) -> list[int]:
            return [int(v) for v in page(f"return [...document.querySelector('{selector}').options].map(o => o.value)")]

        wait(lambda: sorted(running()) == ["sim-0", "sim-1"], 120, "both robots on the page")
        assert not off_screen_pin_buttons(browser)
        first = wait(versions, 30, "the published versions")
        wait(lambda: max(versions()) > max(first), 180, "a newly published version, without a reload")

        browser.find_element(By.ID, "pause").click()  # no token typed
        wait(lambda: "refused (401)" in browser.find_element(By.ID, "message").text, 10, "the refusal")

        browser.find_element(By.ID, "token").send_keys(token_file.read_text().strip())
        # The second oldest: the oldest servable version is dropped at the next publish.
        def three_or_more(selector: str) -> list[int] | None:
            found = options(selector)
            return found if len(found) >= 3 else None

        servable = wait(lambda: three_or_more('select.pin-version[data-robot="sim-0"]'), 120, "three servable versions")
        older = sorted(servable)[1]
        Select(browser.find_element(By.CSS_SELECTOR, 'select.pin-version[data-robot="sim-0"]')).select_by_value(
            str(older))
        browser.find_element(By.CSS_SELECTOR, 'button.pin[data-robot="sim-0"]').click()
        wait(lambda: f"pinned to v{older}" in browser.find_element(By.ID, "message").text, 10, "the pin said done")
        wait(lambda: running()["sim-0"] == older, 60, f"sim-0 executing v{older}")

        target = max(options("#fleet-version"))
        assert target != older
        Select(browser.find_element(By.ID, "fleet-version")).select_by_value(str(target))
        browser.find_element(By.ID, "rollback").click()
        # Waited for together: a robot may already run the target version before
        # the rollback reaches it (sim-1 follows the newest), and only the badge says it is pinned.
        wait(lambda: running() == {"sim-0": target, "sim-1": target} and str(page(
            "return document.querySelector('#robots tbody').textContent")).count(f"pinned v{target}") == 2,
             60, f"both robots on v{target} and pinned to it")
        assert not off_screen_pin_buttons(browser)  # with both pinned badges and rates shown
        browser.save_screenshot(str(tmp_path / "console.png"))
        assert run.poll() is None, "the run ended before the operator's Ctrl-C:\n" + "".join(lines)[-3000:]
    finally:
        if browser is not None:
            browser.quit()
        if run.poll() is None:
            run.send_signal(signal.SIGINT)  # the operator's Ctrl-C; after a failed check too, so the run ends
            try:
                run.wait(300)
            except subprocess.TimeoutExpired:
                run.kill()  # a run that does not end must not outlive the test: its exit code says -9 below
                run.wait(30)
    reader.join(30)
    output = "".join(lines)
    assert run.returncode == 0, output[-3000:]
    assert "robot-rl run: stopping early: each robot ends the episode it is in" in output
    assert "stopped early (Ctrl-C)" in output and "Traceback" not in output, output[-3000:]


def test_at_1400_px_every_robot_s_pin_buttons_are_on_screen_with_every_column_filled(tmp_path):
    """A fleet console whose robots show what a busy fleet shows (rates with their intervals, lateness,
    a pin badge, re-planning), in a 1,400 px window: the robots table fits, the pin buttons in view."""
    from robot_rl.bridges.zmq.streaming import StreamingClient
    from robot_rl.learner.config import ConsoleConfig
    from robot_rl.learner.metrics import EpisodeOutcome
    from robot_rl.learner.service import LearnerService
    from tests.learner_helpers import client_config, learner_config, tiny_policy

    config = learner_config(tmp_path / "learner")
    config.console = ConsoleConfig(port=0, refresh_s=0.1)
    service = LearnerService(config, tiny_policy(), train=False).start()
    links = []
    browser = None
    try:
        for robot in ("so101-left-arm-00", "so101-right-arm-01"):
            link = StreamingClient(client_config(robot, service, tmp_path / "spool"))
            link.report = lambda: {"late_ticks": 12345, "ticks": 987654, "lateness_p99_ms": 12.34,
                                   "lateness_max_ms": 1234.56, "episode": 12345, "replan_slots": 2}
            link.start()
            links.append(link)
            for episode in range(20):  # what the store reports once it has written the robot's episodes
                service.store.outcomes.add(EpisodeOutcome(robot, episode, 0, episode % 3 == 0, 100,
                                                          10 * (episode % 2), episode % 2, 0.0))
        wait(lambda: len(service.robots) == 2, 30, "both robots' hellos")
        service.pin(0, "so101-left-arm-00")
        browser = chromium(1400)
        browser.get(str(service.console.url))
        wait(lambda: browser.execute_script(
            "return document.querySelectorAll('#robots tr[data-robot] .badge').length === 1 && "
            "document.querySelector('#robots td.success').textContent.includes('n=20')"), 30, "the rows drawn")
        assert not off_screen_pin_buttons(browser)
    finally:
        if browser is not None:
            browser.quit()
        for link in links:
            link.stop()
        service.stop(checkpoint=False)
