"""The operator session: episodes on one robot with a policy, a human (or scripted) operator, recording.

Per episode: reset (the sim sets up the next scene itself; on a real robot the operator gets
``reset_time_s`` to put the scene back), then control ticks until the operator says
success / failure / rerecord, the task reports success, the learner's success detector is
sure of a success (``end_on_detected_success``), or time runs out; then the verdict if nobody
gave one: the detector's when it is sure, else the operator's, asked with a key and shown the
detector's guess (the operator's answer is stored as theirs and teaches the detector), else the
task's, else none (the learner's detector judges the whole episode when it is stored). The edge
runtime (``robot_rl.edge.runtime``) streams the episode to the learner while it runs; at the
verdict it is written to the local LeRobotDataset v3 (always, learner or not) and its last step
goes out with the verdict, and the session says it is saved once the learner has acked it (or
that it waits in the spool). A rerecorded attempt is not written locally; the learner, which has
its segments, stores it as truncated (no outcome claimed); the same scene is set up again.

E-stop (key ``e``, Esc, or Ctrl-C): the arm is told to hold its measured position, the
episode so far is saved as a failure, the session ends (exit code 3). It never waits
for anything first: it is checked right after every tick.

Robot fault (``RobotFaultError``: a driver that fell silent, a state older than its limit,
a bus that stopped answering): the arm is told to hold its last commanded target, the
episode so far is saved as aborted, and the session ends (exit code 4) with one line
saying what failed. Never a traceback, never a lost episode.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from robot_rl.core.clock import Clock
from robot_rl.core.robot_io import RobotFaultError
from robot_rl.core.types import UNJUDGED, DetectorGuess, Episode, Step, VerdictSource
from robot_rl.edge.runtime import EdgeRuntime
from robot_rl.hardware.teleop import TeleopEvent, TeleopIntervention
from robot_rl.hardware.teleop.keys import KeySource, NoKeys
from robot_rl.session.config import SessionConfig
from robot_rl.session.scenes import SceneDraw
from robot_rl.session.status import KEY_COMMANDS, KEY_HELP, StatusLine, format_status

log = logging.getLogger(__name__)

EXIT_ESTOP = 3
EXIT_ROBOT_FAULT = 4
_VERDICTS = {TeleopEvent.SUCCESS: "success", TeleopEvent.FAILURE: "failure", TeleopEvent.RERECORD: "rerecord"}


@dataclass
class SessionResult:
    episodes_recorded: int = 0
    successes: int = 0
    rerecorded: int = 0
    intervention_steps: int = 0
    estopped: bool = False
    fault: str | None = None  # what stopped the robot, if a fault did
    outcomes: list[str] = field(default_factory=list)
    asked: int = 0  # verdicts the operator was asked for (the detector was unsure, or had no guess)
    detector_verdicts: int = 0  # verdicts the detector gave, sure, without asking anyone

    @property
    def asked_fraction(self) -> float:
        """The share of the session's verdicts (rerecords included) the operator was asked for."""
        return self.asked / len(self.outcomes) if self.outcomes else 0.0

    @property
    def exit_code(self) -> int:
        if self.fault is not None:
            return EXIT_ROBOT_FAULT
        return EXIT_ESTOP if self.estopped else 0


class OperatorSession:
    """Runs the episodes; the parts (robot, edge runtime, hook, keys) are built by the caller.

    ``scenes`` sets up each episode's scene (the sim's seeds and task families; a real robot
    has none); ``log_path`` gets one JSON line per episode (verdict, dataset index, scene seed,
    whether the learner acked it).
    """

    def __init__(
        self,
        config: SessionConfig,
        robot,
        runtime: EdgeRuntime,
        hook: TeleopIntervention,
        keys: KeySource,
        clock: Clock,
        status: StatusLine | None = None,
        scenes: SceneDraw | None = None,
        log_path: str | Path | None = None,
    ) -> None:
        self.config = config
        self.robot = robot
        self.runtime = runtime
        self.node = runtime.node
        self.hook = hook
        self.keys = keys
        self.clock = clock
        self.status = status or StatusLine(interval_s=config.status_interval_s)
        self.scenes = scenes or SceneDraw(None)
        self.log_path = Path(log_path) if log_path is not None else None
        self.result = SessionResult()
        self._quit = False
        self._tick_times: deque[float] = deque(maxlen=30)

    # -- the session ---------------------------------------------------------------------

    def run(self) -> SessionResult:
        if not isinstance(self.keys, NoKeys):  # session.keys=none: no key does anything, none is shown
            self.status.say(KEY_HELP)
        jog_help = getattr(self.hook.teleop, "key_help", None)
        if jog_help is not None:
            self.status.say(jog_help())
        for episode in range(self.config.episodes):
            outcome = self._episode_with_rerecords(episode)
            if outcome in ("estop", "aborted") or self._quit:
                break
        self.status.say(
            f"session over: {self.result.episodes_recorded} episodes recorded{self._where()}, "
            f"{self.result.successes} successes, {self.result.rerecorded} rerecorded"
            + self._asked_summary()
            + ("  (E-STOP)" if self.result.estopped else "")
            + (f"  (ROBOT FAULT: {self.result.fault})" if self.result.fault else "")
        )
        return self.result

    def _asked_summary(self) -> str:
        result = self.result
        if not result.asked and not result.detector_verdicts:
            return ""
        return (f"; operator asked for {result.asked} of {len(result.outcomes)} verdicts "
                f"({100 * result.asked_fraction:.0f} %), {result.detector_verdicts} given by the success detector")

    def _episode_with_rerecords(self, episode: int) -> str | None:
        """Episode ``episode``, attempted again in the same scene for as long as the operator says rerecord."""
        again = False
        while True:
            instruction = self._reset(episode, again)
            if instruction is None:  # e-stop during the reset wait
                return "estop"
            outcome = self._run_episode(episode, instruction)
            if outcome != "rerecord" or self._quit:
                return outcome
            again = True

    def estop(self, steps: list[Step] | None = None, episode: int = 0, instruction: str = "") -> None:
        """Hold the measured position, save what was recorded, end the session."""
        if self.result.estopped:
            return
        self.result.estopped = True
        try:
            measured = self.robot.get_observation()["state"]
            self.robot.send_action(np.asarray(measured, dtype=np.float32))
        except Exception as exc:  # noqa: BLE001 - an e-stop must finish whatever the robot does
            log.error("e-stop: could not command a hold (%s); cut the arm's power if it still moves", exc)
        self.status.say("E-STOP: arm holding its position; session ends")
        if steps:
            self._write(episode, instruction, steps, "failure", VerdictSource.operator)  # a person stopped it

    def abort(self, fault: RobotFaultError, steps: list[Step], episode: int, instruction: str) -> None:
        """A robot fault: hold the last commanded target (no reading is needed for it), save the
        episode as aborted, end the session (the e-stop path)."""
        self.result.fault = str(fault)
        hold = self.node.last_command
        if hold is not None:
            try:
                self.robot.send_action(hold)
            except Exception as exc:  # noqa: BLE001 - the robot is failing: say so, keep the episode
                log.error("robot fault: could not command a hold either (%s)", exc)
        self.status.say(f"ROBOT FAULT: {fault}. Arm told to hold; episode {episode + 1} saved as aborted; "
                        "session ends (check the driver, then start a new session)")
        self.result.estopped = True
        if steps:
            self._write(episode, instruction, steps, "aborted", VerdictSource.task)  # a fault ends it as failed

    # -- one episode -----------------------------------------------------------------------

    def _reset(self, episode: int, same_scene: bool) -> str | None:
        scene = self.scenes.next(same_scene)
        reset = getattr(self.robot, "reset", None)
        if reset is not None:  # the sim sets up its own scene
            instruction = reset(seed=scene.seed, family=scene.family)
        else:
            instruction = self.config.instruction
            if (episode > 0 or same_scene) and not self._wait_for_reset(episode, same_scene):
                return None
        operator_reset = getattr(self.hook.teleop, "reset_episode", None)
        if operator_reset is not None:
            operator_reset(episode)
        self.hook.reset()
        self.runtime.begin_episode(instruction, scene.seed)
        again = " (again, same scene)" if same_scene else ""
        self.status.say(f"episode {episode + 1}/{self.config.episodes}{again}: {instruction!r}")
        return instruction

    def _wait_for_reset(self, episode: int, same_scene: bool) -> bool:
        """Reset time between episodes on a real robot; [n] skips it, [e] stops."""
        what = "put the scene back as it was" if same_scene else "reset the scene"
        self.status.say(f"{what}: {self.config.reset_time_s:.0f} s ([n] to start now)")
        deadline = time.monotonic() + self.config.reset_time_s
        while time.monotonic() < deadline:
            for command in self._commands(episode, -1):
                if command == "estop":
                    self.estop()
                    return False
                if command == "next":
                    return True
            time.sleep(0.05)
        return True

    def _run_episode(self, episode: int, instruction: str) -> str:
        steps: list[Step] = []
        try:
            return self._control(episode, instruction, steps)
        except KeyboardInterrupt:  # Ctrl-C is an e-stop too
            self.estop(steps, episode, instruction)
            return "estop"
        except RobotFaultError as fault:
            self.abort(fault, steps, episode, instruction)
            return "aborted"

    def _control(self, episode: int, instruction: str, steps: list[Step]) -> str:
        with self.node.realtime():  # the ticks only: stopping, asking and saving run at normal priority
            said = self._tick_until_verdict(episode, steps)
        if said is not None and said[0] == "estop":
            self.estop(steps, episode, instruction)
            return "estop"
        self._hold_arm()
        verdict, source, confidence = said if said is not None else self._verdict_at_the_end(episode)
        if verdict == "estop":
            self.estop(steps, episode, instruction)
            return "estop"
        self._write(episode, instruction, steps, verdict, source, confidence)
        return verdict

    def _tick_until_verdict(self, episode: int, steps: list[Step]) -> tuple[str, str, float] | None:
        """Tick until the operator's verdict, an e-stop ("estop"), the task's success, the detector's
        sure success, or the episode's last tick (None: no verdict yet). Returns the verdict, who gave
        it and how sure."""
        for tick in range(self.config.max_episode_steps):
            for command in self._commands(episode, tick):
                self._apply(command)
            step = self._tick()
            steps.append(step)
            events = self.hook.drain_events()
            if TeleopEvent.ESTOP in events:
                return "estop", VerdictSource.operator, 1.0
            verdict = next((_VERDICTS[e] for e in events if e in _VERDICTS), None)
            self._show(episode, tick)
            if verdict is not None:
                return verdict, VerdictSource.operator, 1.0
            if step.success:
                return "success", VerdictSource.task, 1.0
            guess = self.runtime.detector_guess() if self.config.end_on_detected_success else None
            if guess is not None and guess.sure and guess.success:
                self.result.detector_verdicts += 1
                self.status.say(f"episode {episode + 1}: the success detector is sure it succeeded "
                                f"(confidence {guess.confidence:.2f}); ending it at tick {tick}")
                return _from_detector(guess)
        return None

    def _hold_arm(self) -> None:
        """The episode is over: forget the plan and command the last target alone, so the arm
        stands still while the verdict is asked and the episode saved (a ROS 2 controller would
        otherwise go on through the rest of the last trajectory it was sent). The sim does not move
        between ticks (each command advances its physics by one), so it is left alone."""
        self.node.queue.clear()
        simulated = getattr(self.robot, "reset", None) is not None
        if self.node.last_command is not None and not simulated:
            self.robot.send_action(self.node.last_command)

    def _tick(self) -> Step:
        step = self.runtime.tick()
        self._tick_times.append(time.monotonic())
        return step

    def _commands(self, episode: int, tick: int) -> list[str]:
        keys = self.keys.poll(episode, tick)
        feed = getattr(self.hook.teleop, "feed", None)  # keyboard jog takes the other keys
        if feed is not None:
            feed([k for k in keys if k not in KEY_COMMANDS])
        return [KEY_COMMANDS[k] for k in keys if k in KEY_COMMANDS]

    def _apply(self, command: str) -> None:
        if command == "toggle":
            if self.hook.intervening:
                self.hook.push_event(TeleopEvent.HAND_BACK)
                self.status.say("operator hands back: the policy drives again (eased from your pose)")
            else:
                self.hook.push_event(TeleopEvent.TAKE_OVER)
                self.status.say("operator takes over: you drive; [space] hands back")
        elif command in ("success", "failure", "rerecord", "estop"):
            self.hook.push_event(TeleopEvent(command))
        elif command == "quit":
            self._quit = True
            self.status.say("quitting after this episode")

    def _verdict_at_the_end(self, episode: int) -> tuple[str, str, float]:
        """Time ran out without a verdict. The learner's success detector gives it when it is sure;
        else the operator is asked (shown the detector's guess, if any); with nobody to ask, the task
        judges. A robot without a task oracle (a real arm) and nobody to ask leaves the episode
        unjudged: it is sent as a failure nobody vouched for (``UNJUDGED``), which the learner's
        detector judges once it has all of it."""
        guess = self.runtime.detector_guess(self.config.detector_wait_s)
        if guess is not None and guess.sure:
            self.result.detector_verdicts += 1
            self.status.say(f"episode {episode + 1} over: the success detector is sure of a "
                            f"{_word(guess)} (confidence {guess.confidence:.2f}); nobody asked")
            return _from_detector(guess)
        if not self.config.ask_outcome or not getattr(self.keys, "interactive", False):
            is_success = getattr(self.robot, "is_success", None)
            if is_success is None:
                return "failure", UNJUDGED, 0.0
            return ("success" if is_success() else "failure"), VerdictSource.task, 1.0
        self.result.asked += 1
        hint = "" if guess is None else (f" (the success detector guesses {_word(guess)}, confidence "
                                         f"{guess.confidence:.2f}, unsure)")
        self.status.say(f"episode {episode + 1} over{hint}: [s] success  [f] failure  [r] rerecord  [e] e-stop")
        while True:
            for command in self._commands(episode, -1):
                if command in ("success", "failure", "rerecord", "estop"):
                    return command, VerdictSource.operator, 1.0
            time.sleep(0.05)

    # -- saving --------------------------------------------------------------------------

    def _write(self, episode: int, instruction: str, steps: list[Step], verdict: str, source: str,
               confidence: float = 1.0) -> None:
        """Record locally and send the verdict, who gave it (``source``: a ``VerdictSource``, or
        ``UNJUDGED``) and how sure (``confidence``) on the last step, then wait (bounded) for the
        learner's ack."""
        self.result.outcomes.append(verdict)
        if verdict == "rerecord":
            self.runtime.discard_episode()
            self.result.rerecorded += 1
            self.status.say(f"episode {episode + 1}: thrown away; rerecording it in the same scene")
            self._log(episode, verdict, steps, None, None)
            return
        success = verdict == "success"
        steps[-1].done = True
        steps[-1].success = success
        steps[-1].success_source = str(source)
        steps[-1].success_confidence = 0.0 if source == UNJUDGED else float(confidence)
        seed = steps[0].scene_seed
        record = Episode(getattr(self.robot, "name", "robot"), episode, instruction, steps=steps, success=success,
                         seed=seed if seed >= 0 else None)
        index = self.runtime.finish_episode(record)
        self.result.episodes_recorded += 1
        self.result.successes += success
        self.result.intervention_steps += record.intervention_steps
        delivery = self._delivery()
        self._log(episode, verdict, steps, index, delivery)
        where = "" if index is None else f" -> dataset episode {index}"
        self.status.say(
            f"episode {episode + 1}: {verdict}, {len(steps)} steps, {record.intervention_steps} intervened"
            f"{where}{'' if delivery is None else '; ' + delivery}"
        )

    def _delivery(self) -> str | None:
        """What became of the episode's segments, in words (None: no learner)."""
        link = self.runtime.link
        if link is None:
            return None
        connected = link.link.connected
        if connected and self.runtime.wait_acked(self.config.ack_timeout_s):
            return f"learner acked it (weights v{self.node.policy_version} in use)"
        pending = link.link.stats().get("pending", 0)
        why = f"not acked within {self.config.ack_timeout_s:g} s" if connected else "learner not reachable"
        return f"{why}: it waits in the spool ({pending} segments unacked) and is sent when the learner is back"

    def _where(self) -> str:
        recorder = self.runtime.recorder
        return "" if recorder is None else f" in {recorder.root}"

    def _log(self, episode: int, verdict: str, steps: list[Step], index: int | None, delivery: str | None) -> None:
        if self.log_path is None:
            return
        versions = sorted({s.policy_version for s in steps})
        line: dict[str, Any] = {
            "episode": episode, "verdict": verdict, "steps": len(steps),
            "intervention_steps": sum(s.is_intervention for s in steps), "dataset_index": index,
            "scene_seed": steps[0].scene_seed if steps and steps[0].scene_seed >= 0 else None,
            "policy_versions": versions, "learner": delivery, "time": time.time(),
            "source": steps[-1].success_source if steps and verdict != "rerecord" else None,
        }
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("a") as out:
            out.write(json.dumps(line) + "\n")

    def _show(self, episode: int, tick: int) -> None:
        times = self._tick_times
        hz = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0
        latencies = self.node.stats.inference_latency_s
        self.status.show(format_status(
            episode, self.config.episodes, self.result.successes, tick, hz,
            latencies[-1] * 1000.0 if latencies else None, self.node.delay.estimate(),
            self.node.policy_version, self.hook.intervening,
        ))


def _word(guess: DetectorGuess) -> str:
    return "success" if guess.success else "failure"


def _from_detector(guess: DetectorGuess) -> tuple[str, str, float]:
    """A detector's guess as the session's (verdict, source, confidence)."""
    return _word(guess), VerdictSource.detector.value, guess.confidence
