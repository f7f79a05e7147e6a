"""The operator session: episodes on one robot with a policy, a human (or scripted) operator, recording.

Per episode: reset (the sim resets itself; on a real robot the operator gets
``reset_time_s`` to put the scene back), then control ticks until the operator says
success / failure / rerecord, the task reports success, or time runs out; then the
verdict (asked with a key if nobody gave one), and the episode is written to the local
LeRobotDataset v3 (always, learner or not; rerecorded episodes are not written).

E-stop (key ``e``, Esc, or Ctrl-C): the arm is told to hold its measured position, the
episode so far is saved as a failure, the session ends (exit code 3). It never waits
for anything first: it is checked right after every tick.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from robot_rl.core.clock import Clock
from robot_rl.core.types import Episode, Step
from robot_rl.data.recorder import EpisodeRecorder
from robot_rl.edge import EdgeNode
from robot_rl.hardware.teleop import TeleopEvent, TeleopIntervention
from robot_rl.hardware.teleop.keys import KeySource
from robot_rl.session.config import SessionConfig
from robot_rl.session.status import KEY_COMMANDS, KEY_HELP, StatusLine, format_status

log = logging.getLogger(__name__)

EXIT_ESTOP = 3
_VERDICTS = {TeleopEvent.SUCCESS: "success", TeleopEvent.FAILURE: "failure", TeleopEvent.RERECORD: "rerecord"}


@dataclass
class SessionResult:
    episodes_recorded: int = 0
    successes: int = 0
    rerecorded: int = 0
    intervention_steps: int = 0
    estopped: bool = False
    outcomes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_ESTOP if self.estopped else 0


class OperatorSession:
    """Runs the episodes; the parts (robot, node, hook, keys, recorder) are built by the caller."""

    def __init__(
        self,
        config: SessionConfig,
        robot,
        node: EdgeNode,
        hook: TeleopIntervention,
        keys: KeySource,
        recorder: EpisodeRecorder,
        clock: Clock,
        status: StatusLine | None = None,
        streamer=None,
        viewer=None,
    ) -> None:
        self.config = config
        self.robot = robot
        self.node = node
        self.hook = hook
        self.keys = keys
        self.recorder = recorder
        self.clock = clock
        self.status = status or StatusLine(interval_s=config.status_interval_s)
        self.streamer = streamer
        self.viewer = viewer
        self.result = SessionResult()
        self._quit = False
        self._tick_times: deque[float] = deque(maxlen=30)

    # -- the session ---------------------------------------------------------------------

    def run(self) -> SessionResult:
        self.status.say(KEY_HELP)
        for episode in range(self.config.episodes):
            instruction = self._reset(episode)
            if instruction is None:  # e-stop during the reset wait
                break
            outcome = self._run_episode(episode, instruction)
            if outcome == "estop" or self._quit:
                break
        self.status.say(
            f"session over: {self.result.episodes_recorded} episodes recorded in {self.recorder.root}, "
            f"{self.result.successes} successes, {self.result.rerecorded} rerecorded"
            + ("  (E-STOP)" if self.result.estopped else "")
        )
        return self.result

    def estop(self, steps: list[Step] | None = None, episode: int = 0, instruction: str = "") -> None:
        """Hold the measured position, save what was recorded, end the session."""
        if self.result.estopped:
            return
        self.result.estopped = True
        try:
            measured = self.robot.get_observation()["state"]
            self.robot.send_action(np.asarray(measured, dtype=np.float32))
        except Exception:
            log.exception("e-stop: could not command a hold; cut the arm's power if it still moves")
        self.status.say("E-STOP: arm holding its position; session ends")
        if steps:
            self._write(episode, instruction, steps, "failure")

    # -- one episode -----------------------------------------------------------------------

    def _reset(self, episode: int) -> str | None:
        reset = getattr(self.robot, "reset", None)
        if reset is not None:  # the sim resets its own scene
            instruction = reset(seed=self.config.seed + episode)
        else:
            instruction = self.config.instruction
            if episode > 0 and not self._wait_for_reset(episode):
                return None
        operator_reset = getattr(self.hook.teleop, "reset_episode", None)
        if operator_reset is not None:
            operator_reset(episode)
        self.hook.reset()
        self.node.reset_episode(instruction)
        if self.streamer is not None:
            self.streamer.begin_episode(self._stream_episode_id(episode))
        self.status.say(f"episode {episode + 1}/{self.config.episodes}: {instruction!r}")
        return instruction

    def _wait_for_reset(self, episode: int) -> bool:
        """Reset time between episodes on a real robot; [n] skips it, [e] stops."""
        self.status.say(f"reset the scene: {self.config.reset_time_s:.0f} s ([n] to start now)")
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

    def _control(self, episode: int, instruction: str, steps: list[Step]) -> str:
        verdict: str | None = None
        for tick in range(self.config.max_episode_steps):
            for command in self._commands(episode, tick):
                self._apply(command)
            step = self._tick()
            steps.append(step)
            events = self.hook.drain_events()
            if TeleopEvent.ESTOP in events:
                self.estop(steps, episode, instruction)
                return "estop"
            verdict = next((_VERDICTS[e] for e in events if e in _VERDICTS), None)
            self._show(episode, tick)
            if verdict is not None:
                break
            if step.success:
                verdict = "success"
                break
        if verdict is None:
            verdict = self._ask_verdict(episode)
            if verdict == "estop":
                self.estop(steps, episode, instruction)
                return "estop"
        self._write(episode, instruction, steps, verdict)
        return verdict

    def _tick(self) -> Step:
        step = self.node.tick()
        self._tick_times.append(time.monotonic())
        if self.viewer is not None:
            self.viewer.log_step(step)
        return step

    def _commands(self, episode: int, tick: int) -> list[str]:
        keys = self.keys.poll(episode, tick)
        feed = getattr(self.hook.teleop, "feed", None)  # keyboard jog takes the other keys
        if feed is not None:
            feed([k for k in keys if k not in KEY_COMMANDS])
        return [KEY_COMMANDS[k] for k in keys if k in KEY_COMMANDS]

    def _apply(self, command: str) -> None:
        if command == "toggle":
            self.hook.push_event(TeleopEvent.HAND_BACK if self.hook.intervening else TeleopEvent.TAKE_OVER)
        elif command in ("success", "failure", "rerecord", "estop"):
            self.hook.push_event(TeleopEvent(command))
        elif command == "quit":
            self._quit = True
            self.status.say("quitting after this episode")

    def _ask_verdict(self, episode: int) -> str:
        """Time ran out without a verdict: ask for a key, or judge from the task if nobody can answer."""
        is_success = getattr(self.robot, "is_success", None)
        automatic = "success" if is_success is not None and is_success() else "failure"
        if not self.config.ask_outcome or not getattr(self.keys, "interactive", False):
            return automatic
        self.status.say(f"episode {episode + 1} over: [s] success  [f] failure  [r] rerecord  [e] e-stop")
        while True:
            for command in self._commands(episode, -1):
                if command in ("success", "failure", "rerecord", "estop"):
                    return command
            time.sleep(0.05)

    def _write(self, episode: int, instruction: str, steps: list[Step], verdict: str) -> None:
        self.result.outcomes.append(verdict)
        success = verdict == "success"
        steps[-1].done = True
        steps[-1].success = success
        if self.streamer is not None:  # the verdict travels on the episode's last streamed step
            self.streamer.end_episode()
        if verdict == "rerecord":
            self.result.rerecorded += 1
            self.status.say(f"episode {episode + 1}: thrown away (rerecord)")
            return
        record = Episode(getattr(self.robot, "name", "robot"), episode, instruction, steps=steps, success=success,
                         seed=self.config.seed + episode)
        index = self.recorder.write_episode(record)
        self.result.episodes_recorded += 1
        self.result.successes += success
        self.result.intervention_steps += record.intervention_steps
        self.status.say(
            f"episode {episode + 1}: {verdict}, {len(steps)} steps, {record.intervention_steps} intervened "
            f"-> dataset episode {index}"
        )

    def _show(self, episode: int, tick: int) -> None:
        times = self._tick_times
        hz = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0
        latencies = self.node.stats.inference_latency_s
        self.status.show(format_status(
            episode, self.config.episodes, self.result.successes, tick, hz,
            latencies[-1] * 1000.0 if latencies else None, self.node.delay.estimate(),
            self.node.policy_version, self.hook.intervening,
        ))

    def _stream_episode_id(self, episode: int) -> int:
        from robot_rl.edge.streaming import wall_clock_episode_id

        return wall_clock_episode_id()
