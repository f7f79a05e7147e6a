"""Language-conditioned tasks: what to do, where things start, and when it is done.

Three families x three colours:

* ``pick``  - "pick up the red cube": success when the cube is held by the jaws with
  its centre >= 5 cm above where it rested.
* ``push``  - "push the blue cube to the left": success when the cube has slid >= 5 cm
  the named way along the table and was never carried (lifted > 3 cm) on the way.
  Left/right are as seen in the ``front`` camera image (the view of a person facing
  the robot): left is the world's -y, right is +y.
* ``place`` - "put the green cube in the bowl": success when the cube rests inside the
  bowl and the gripper has let go of it.

Everything here is pure: functions of a ``WorldSnapshot`` (privileged sim state that
``SimSO101`` reads out each tick), the ``TaskSpec`` and the episode's ``TaskProgress``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from robot_rl.hardware.sim.scene import (
    BOWL_FLOOR_THICKNESS,
    BOWL_INNER_HALF,
    COLORS,
    CUBE_HALF,
    PAN_AXIS_XY,
)

TASK_FAMILIES: tuple[str, ...] = ("pick", "push", "place")
TASK_COLORS: tuple[str, ...] = tuple(COLORS)
PUSH_DIRECTIONS: dict[str, np.ndarray] = {"left": np.array([0.0, -1.0]), "right": np.array([0.0, 1.0])}

PICK_LIFT = 0.05  # m of cube rise that counts as picked up
PUSH_DISTANCE = 0.05  # m of displacement along the named direction
PUSH_MAX_RISE = 0.03  # a cube lifted higher than this was carried, not pushed
PLACE_MAX_SPEED = 0.05  # m/s; the cube must have settled, not be bouncing through
ON_TABLE_TOLERANCE = 0.01

# Where things may be put: an annulus sector around the pan axis that the arm reaches
# with the gripper pointing straight down (the wrist runs out of travel farther out).
REACH_RADIUS = (0.13, 0.27)
REACH_ANGLE = math.radians(50.0)
BOWL_RADIUS = (0.17, 0.25)
BOWL_ANGLE = math.radians(40.0)
MIN_CUBE_GAP = 0.075  # centre to centre, so open jaws fit between cubes
MIN_CUBE_BOWL_GAP = 0.10
# Cubes are yawed by at most this much from facing the arm, so the face the jaws
# should close on is never ambiguous (that happens at 45 degrees).
MAX_CUBE_YAW = math.radians(30.0)
PUSH_TRAVEL = 0.08  # room kept free ahead of a cube to be pushed


@dataclass(frozen=True)
class TaskSpec:
    """One instruction. ``direction`` is "left"/"right" for push tasks, else None."""

    family: str
    color: str
    instruction: str
    direction: str | None = None

    @property
    def push_vector(self) -> np.ndarray:
        """Unit (x, y) direction of a push task."""
        if self.direction is None:
            raise ValueError(f"{self.family} task {self.instruction!r} has no push direction")
        return PUSH_DIRECTIONS[self.direction]


@dataclass(frozen=True)
class Layout:
    """Where the cubes (x, y, yaw) and the bowl (x, y) start."""

    cubes: dict[str, tuple[float, float, float]]
    bowl: tuple[float, float]


@dataclass
class TaskProgress:
    """Per-episode bookkeeping that success depends on and a snapshot cannot show."""

    start_position: np.ndarray  # target cube at reset (or after move_target)
    max_rise: float = 0.0

    def update(self, world: WorldSnapshot, task: TaskSpec) -> None:
        rise = float(world.cube_position[task.color][2] - self.start_position[2])
        self.max_rise = max(self.max_rise, rise)

    def copy(self) -> TaskProgress:
        return TaskProgress(self.start_position.copy(), self.max_rise)


@dataclass(frozen=True)
class WorldSnapshot:
    """Privileged state the tasks and the scripted expert read (never the policy)."""

    cube_position: dict[str, np.ndarray]
    cube_yaw: dict[str, float]
    cube_speed: dict[str, float]
    cube_touches_gripper: dict[str, bool]
    cube_held: dict[str, bool]  # pinched between the fixed and the moving jaw
    bowl_position: np.ndarray
    ee_position: np.ndarray
    gripper_opening: float  # 0 closed .. 100 open, measured


def make_task(family: str, color: str, direction: str | None = None) -> TaskSpec:
    """A TaskSpec with its instruction text; raises ValueError naming what is allowed."""
    if family not in TASK_FAMILIES:
        raise ValueError(f"unknown task family {family!r}; choose one of {TASK_FAMILIES}")
    if color not in TASK_COLORS:
        raise ValueError(f"unknown cube colour {color!r}; choose one of {TASK_COLORS}")
    if family == "push":
        if direction not in PUSH_DIRECTIONS:
            raise ValueError(f"push needs a direction in {tuple(PUSH_DIRECTIONS)}, got {direction!r}")
        return TaskSpec(family, color, f"push the {color} cube to the {direction}", direction)
    if family == "pick":
        return TaskSpec(family, color, f"pick up the {color} cube")
    return TaskSpec(family, color, f"put the {color} cube in the bowl")


def sample_task(rng: np.random.Generator, family: str | None = None, color: str | None = None) -> TaskSpec:
    """Draw a task; the draws happen even when overridden, so the layout that follows
    depends on the seed only, not on which overrides were given."""
    drawn_family = TASK_FAMILIES[rng.integers(len(TASK_FAMILIES))]
    drawn_color = TASK_COLORS[rng.integers(len(TASK_COLORS))]
    drawn_direction = tuple(PUSH_DIRECTIONS)[rng.integers(len(PUSH_DIRECTIONS))]
    return make_task(family or drawn_family, color or drawn_color, drawn_direction)


def _polar_xy(rng: np.random.Generator, radius: tuple[float, float], max_angle: float) -> np.ndarray:
    r = rng.uniform(*radius)
    a = rng.uniform(-max_angle, max_angle)
    return PAN_AXIS_XY + r * np.array([math.cos(a), math.sin(a)])


def reachable(xy: np.ndarray, margin: float = 0.0) -> bool:
    """Inside the sector the arm reaches top-down (shrunk by ``margin``)."""
    rel = np.asarray(xy)[:2] - PAN_AXIS_XY
    r = float(np.linalg.norm(rel))
    a = abs(math.atan2(rel[1], rel[0]))
    return REACH_RADIUS[0] + margin <= r <= REACH_RADIUS[1] - margin and a <= REACH_ANGLE


def sample_cube_spot(
    rng: np.random.Generator,
    others: list[np.ndarray],
    bowl_xy: np.ndarray,
    task: TaskSpec | None = None,
    max_tries: int = 1000,
) -> tuple[float, float, float]:
    """A free (x, y, yaw) for a cube, clear of ``others`` and the bowl.

    For the target of a push task the path ahead must be free and end inside reach.
    """
    for _ in range(max_tries):
        xy = _polar_xy(rng, REACH_RADIUS, REACH_ANGLE)
        radial = math.atan2(xy[1] - PAN_AXIS_XY[1], xy[0] - PAN_AXIS_XY[0])
        yaw = radial + rng.uniform(-MAX_CUBE_YAW, MAX_CUBE_YAW)
        if any(np.linalg.norm(xy - o[:2]) < MIN_CUBE_GAP for o in others):
            continue
        if np.linalg.norm(xy - bowl_xy) < MIN_CUBE_BOWL_GAP:
            continue
        if task is not None and task.family == "push" and not _push_path_clear(xy, task, others, bowl_xy):
            continue
        return float(xy[0]), float(xy[1]), float(yaw)
    raise RuntimeError("could not find a free spot for a cube; the layout constraints are too tight")


def _push_path_clear(xy: np.ndarray, task: TaskSpec, others: list[np.ndarray], bowl_xy: np.ndarray) -> bool:
    d = task.push_vector
    end = xy + d * PUSH_TRAVEL
    behind = xy - d * 0.04  # where the closed jaws start the push
    if not (reachable(end) and reachable(behind)):
        return False
    for obstacle, clearance in [(o[:2], MIN_CUBE_GAP) for o in others] + [(bowl_xy, MIN_CUBE_BOWL_GAP)]:
        rel = obstacle - xy
        along = float(rel @ d)
        across = abs(float(rel @ np.array([-d[1], d[0]])))
        if -0.05 < along < PUSH_TRAVEL + clearance and across < clearance:
            return False
    return True


def sample_layout(rng: np.random.Generator, task: TaskSpec, max_tries: int = 200) -> Layout:
    """Bowl first (it is the biggest), then the target cube, then the two others.

    A draw that boxes itself in (no free spot left) is thrown away and redrawn from
    the same generator, so the result still depends on the seed only.
    """
    for _ in range(max_tries):
        bowl_xy = _polar_xy(rng, BOWL_RADIUS, BOWL_ANGLE)
        cubes: dict[str, tuple[float, float, float]] = {}
        try:
            for color in [task.color] + [c for c in TASK_COLORS if c != task.color]:
                others = [np.array(p[:2]) for p in cubes.values()]
                target_task = task if color == task.color else None
                cubes[color] = sample_cube_spot(rng, others, bowl_xy, target_task, max_tries=200)
        except RuntimeError:
            continue
        if task.family == "push":  # the other cubes must not sit in the push path either
            others = [np.array(cubes[c][:2]) for c in TASK_COLORS if c != task.color]
            if not _push_path_clear(np.array(cubes[task.color][:2]), task, others, bowl_xy):
                continue
        return Layout(cubes={c: cubes[c] for c in TASK_COLORS}, bowl=(float(bowl_xy[0]), float(bowl_xy[1])))
    raise RuntimeError(f"no valid layout for {task.instruction!r} in {max_tries} draws")


# ---------------------------------------------------------------- success and reward


def _push_displacement(world: WorldSnapshot, task: TaskSpec, progress: TaskProgress) -> float:
    delta = world.cube_position[task.color][:2] - progress.start_position[:2]
    return float(delta @ task.push_vector)


def in_bowl(world: WorldSnapshot, color: str) -> bool:
    """Cube centre over the bowl floor, low enough to rest on it."""
    cube = world.cube_position[color]
    offset = np.abs(cube[:2] - world.bowl_position[:2])
    resting_z = world.bowl_position[2] + BOWL_FLOOR_THICKNESS + CUBE_HALF
    return bool(np.all(offset < BOWL_INNER_HALF - 0.004) and cube[2] < resting_z + ON_TABLE_TOLERANCE)


def is_success(world: WorldSnapshot, task: TaskSpec, progress: TaskProgress) -> bool:
    cube = world.cube_position[task.color]
    rise = float(cube[2] - progress.start_position[2])
    if task.family == "pick":
        return bool(world.cube_held[task.color] and rise >= PICK_LIFT)
    if task.family == "push":
        return bool(
            _push_displacement(world, task, progress) >= PUSH_DISTANCE
            and progress.max_rise <= PUSH_MAX_RISE
            and rise < ON_TABLE_TOLERANCE
        )
    return bool(
        in_bowl(world, task.color)
        and not world.cube_touches_gripper[task.color]
        and world.cube_speed[task.color] < PLACE_MAX_SPEED
    )


def reward(world: WorldSnapshot, task: TaskSpec, progress: TaskProgress) -> float:
    """Dense shaping in [0, 1]; exactly 1.0 on success.

    Reaching (gripper near the cube) is worth a little, the task-specific progress
    most, so a policy that only hovers at the cube cannot collect most of the reward.
    """
    if is_success(world, task, progress):
        return 1.0
    cube = world.cube_position[task.color]
    reach = math.exp(-float(np.linalg.norm(world.ee_position - cube)) / 0.05)
    rise = float(cube[2] - progress.start_position[2])
    held = float(world.cube_held[task.color])
    if task.family == "pick":
        return 0.25 * reach + 0.25 * held + 0.45 * min(max(rise / PICK_LIFT, 0.0), 1.0)
    if task.family == "push":
        moved = min(max(_push_displacement(world, task, progress) / PUSH_DISTANCE, 0.0), 1.0)
        return 0.3 * reach + 0.65 * moved
    start_gap = float(np.linalg.norm(progress.start_position[:2] - world.bowl_position[:2]))
    gap = float(np.linalg.norm(cube[:2] - world.bowl_position[:2]))
    closer = min(max(1.0 - gap / max(start_gap, 1e-6), 0.0), 1.0)
    return 0.2 * reach + 0.15 * max(held, float(rise > 0.02)) + 0.6 * closer


def bowl_top_z(world: WorldSnapshot) -> float:
    """Height of the bowl floor's top surface (where a placed cube rests on)."""
    return float(world.bowl_position[2] + BOWL_FLOOR_THICKNESS)
