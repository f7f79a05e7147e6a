"""The scripted operator: a simulated person who watches the policy and takes over when it goes wrong.

It stands in for the human at the robot in sim runs, so interventions (and the data
they produce) can be studied without a person. Like a person it

* watches the end effector against the current target (the cube, then where a held cube goes)
  and notices trouble: moving away from the target, being stuck, or dropping the cube (a cube let
  go where it should go was put down);
* reacts after a human-like delay (a few hundred ms, jittered), not instantly;
* drives with the scripted expert for a while, then hands back to the policy;
* has a budget (takeovers per episode and intervened ticks), as a person's patience;
* says "success" when the task is done.

Everything random comes from one generator seeded by (seed, episode), so a run is
reproducible.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from robot_rl.core.registry import TELEOPS
from robot_rl.hardware.robot import Observation
from robot_rl.hardware.teleop.base import TeleopConfig, TeleopEvent, TeleopReading

log = logging.getLogger(__name__)


class WatchedWorld(Protocol):
    """What the operator can see (the simulated robot provides it)."""

    def ee_position(self) -> np.ndarray: ...

    def target_position(self) -> np.ndarray: ...

    def is_success(self) -> bool: ...


class Expert(Protocol):
    def act(self) -> np.ndarray: ...


@TELEOPS.register("scripted", builder="robot_rl.hardware.teleop.scripted:scripted_operator_for_sim")
@dataclass
class ScriptedOperatorConfig(TeleopConfig):
    """Reaction, judgement and budget of the simulated person (ticks are control ticks; sim only)."""

    seed: int = 0
    reaction_ticks: int = 9  # ~0.3 s at 30 Hz: a human's reaction time
    reaction_jitter_ticks: int = 4
    grace_ticks: int = 20  # let the policy start before judging it
    watch_ticks: int = 15  # window over which "moving away" is judged
    away_margin_m: float = 0.03  # distance to target grew this much above its recent best
    stuck_ticks: int = 45  # no motion for this long (and not done) = stuck
    stuck_eps_m: float = 0.004
    drive_ticks: int = 60  # how long the operator drives once it took over
    drive_jitter_ticks: int = 15
    cooldown_ticks: int = 20  # after a hand-back or a put-down, watch this long before judging again
    # A held cube let go this near where it should go (over the bowl, for a place) was put down, not dropped.
    put_down_margin_m: float = 0.04
    max_takeovers: int = 3  # per episode
    max_intervention_ticks: int = 200  # per episode
    announce_success: bool = True


class ScriptedOperator:
    """Teleop backend driven by the scripted expert; see the module docstring."""

    name = "scripted"

    def __init__(self, world: WatchedWorld, expert: Expert, config: ScriptedOperatorConfig | None = None) -> None:
        self.world = world
        self.expert = expert
        self.config = config or ScriptedOperatorConfig()
        self.reset_episode(0)

    # -- episode bookkeeping ---------------------------------------------------------

    def reset_episode(self, episode: int) -> None:
        """Forget the last episode; the random stream depends on (seed, episode) only."""
        cfg = self.config
        self.rng = np.random.default_rng([cfg.seed, episode])
        self.tick = 0
        self.driving = False
        self.takeovers = 0
        self.intervention_ticks = 0
        self.reasons: list[str] = []
        self._react_at: int | None = None
        self._drive_left = 0
        self._watch_from = cfg.grace_ticks
        self._dist: deque[float] = deque(maxlen=cfg.watch_ticks)
        self._ee: deque[np.ndarray] = deque(maxlen=cfg.stuck_ticks)
        self._was_holding = False
        self._held_off_target_m = np.inf
        self._just_dropped = False
        self._said_success = False

    def connect(self) -> None:
        pass

    def disconnect(self) -> None:
        pass

    # -- one tick --------------------------------------------------------------------

    def read(self, observation: Observation) -> TeleopReading:
        t = self.tick
        self.tick += 1
        events: list[TeleopEvent] = []
        if self.world.is_success():
            if self.config.announce_success and not self._said_success:
                self._said_success = True
                events.append(TeleopEvent.SUCCESS)
            return TeleopReading(events=events)
        self._observe()
        if self.driving:
            return self._drive(events)
        if self._react_at is not None and t >= self._react_at:
            self._react_at = None
            if self._budget_left():
                self.driving = True
                self.takeovers += 1
                self._drive_left = self.config.drive_ticks + self._jitter(self.config.drive_jitter_ticks)
                events.append(TeleopEvent.TAKE_OVER)
                return self._drive(events)
        if self._react_at is None and t >= self._watch_from and self._budget_left():
            reason = self._trouble()
            if reason is not None:
                self.reasons.append(reason)
                reaction = self.config.reaction_ticks + self._jitter(self.config.reaction_jitter_ticks)
                self._react_at = t + max(0, reaction)
                log.info("scripted operator noticed %s at tick %d; takes over at tick %d", reason, t, self._react_at)
        return TeleopReading(events=events)

    def _drive(self, events: list[TeleopEvent]) -> TeleopReading:
        action = np.asarray(self.expert.act(), dtype=np.float32)
        self.intervention_ticks += 1
        self._drive_left -= 1
        if self._drive_left <= 0 or self.intervention_ticks >= self.config.max_intervention_ticks:
            self.driving = False
            self._watch_from = self.tick + self.config.cooldown_ticks
            self._dist.clear()
            self._ee.clear()
            events.append(TeleopEvent.HAND_BACK)
        return TeleopReading(action=action, events=events)

    # -- judgement -------------------------------------------------------------------

    def _observe(self) -> None:
        ee = np.asarray(self.world.ee_position(), dtype=np.float64)
        target = np.asarray(self.world.target_position(), dtype=np.float64)
        holding_fn = getattr(self.world, "is_cube_held", None)  # not every world can tell
        holding = bool(holding_fn()) if holding_fn is not None else False
        released = self._was_holding and not holding
        put_down = released and self._held_off_target_m <= self.config.put_down_margin_m
        if holding != self._was_holding:
            # The target moved: from the cube to where a held cube goes (above where it started for a pick, the
            # bowl for a place), or back. Distances to the old target say nothing of the way to the new
            # one: against the jaws' near-zero distance at the grasp, every grasp looked like "moving away".
            self._dist.clear()
        if put_down:  # the cube falls and settles in the bowl while the arm rises: let the task say so
            self._watch_from = max(self._watch_from, self.tick + self.config.cooldown_ticks)
        self._dist.append(float(np.linalg.norm(ee - target)))
        self._ee.append(ee)
        self._just_dropped = released and not put_down
        self._was_holding = holding
        # How far, across the table, the held cube is from where it goes: a cube let go over the bowl
        # is lowered into it first, so its height says nothing of a put-down.
        self._held_off_target_m = float(np.linalg.norm((ee - target)[:2])) if holding else np.inf

    def _trouble(self) -> str | None:
        cfg = self.config
        if self._just_dropped:
            return "a dropped cube"
        if len(self._dist) == self._dist.maxlen and self._dist[-1] - min(self._dist) > cfg.away_margin_m:
            return "the arm moving away from the target"
        if len(self._ee) == self._ee.maxlen:
            spread = np.linalg.norm(np.ptp(np.stack(self._ee), axis=0))
            if spread < cfg.stuck_eps_m:
                return "the arm being stuck"
        return None

    def _budget_left(self) -> bool:
        cfg = self.config
        return self.takeovers < cfg.max_takeovers and self.intervention_ticks < cfg.max_intervention_ticks

    def _jitter(self, width: int) -> int:
        return int(self.rng.integers(-width, width + 1)) if width > 0 else 0


class _SimView:
    """What a person at the sim can see: end effector, target, success, and whether the cube is held.

    For a push a person judges the arm against the spot behind the cube it must push
    from (going around the cube to get there is not "moving away"), and a pushed cube is
    never carried, so it cannot be dropped: closed jaws touching it on both sides while
    pushing look like a pinch to the sim, and letting go of that is no mistake.
    """

    def __init__(self, robot) -> None:
        self.robot = robot

    def ee_position(self) -> np.ndarray:
        return self.robot.ee_position()

    def target_position(self) -> np.ndarray:
        target = np.asarray(self.robot.target_position(), dtype=np.float64)
        task = self.robot.task
        if task.family != "push":
            return target
        # MuJoCo (the sim extra), here and below: every configuration reads this module's ScriptedOperatorConfig
        from robot_rl.hardware.sim.expert import PUSH_START_GAP
        from robot_rl.hardware.sim.tasks import PUSH_DIRECTIONS

        behind = target.copy()
        behind[:2] -= np.asarray(PUSH_DIRECTIONS[task.direction]) * PUSH_START_GAP
        return behind

    def is_success(self) -> bool:
        return bool(self.robot.is_success())

    def is_cube_held(self) -> bool:
        if self.robot.task.family == "push":
            return False
        return bool(self.robot.world().cube_held.get(self.robot.task.color, False))


def scripted_operator_for_sim(config: ScriptedOperatorConfig | None, robot,
                              expert: Expert | None = None) -> ScriptedOperator:
    """A scripted operator watching ``robot`` (a ``SimSO101``) and driving it with ``expert``
    (default: a full-speed ScriptedExpert). Give it the demonstrator's expert so that its
    corrections move like the demonstrations: mixed speeds in one replay confuse the policy."""
    from robot_rl.hardware.sim.expert import ScriptedExpert  # MuJoCo (the sim extra)

    missing = [m for m in ("ee_position", "target_position", "world", "reset") if not hasattr(robot, m)]
    if missing:
        raise ValueError(
            f"the scripted operator needs the simulator (robot {getattr(robot, 'name', robot)!r} lacks {missing}); "
            "use teleop=leader, gamepad or keyboard on a real robot"
        )
    return ScriptedOperator(_SimView(robot), expert or ScriptedExpert(robot), config)
