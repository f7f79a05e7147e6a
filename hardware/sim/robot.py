"""``SimSO101``: the simulated SO-101 cell behind the ``robot_rl.hardware.robot.Robot`` protocol.

Units are LeRobot's SO-101 units, so a policy moves between sim and a real arm
unchanged: five arm joints in degrees, the gripper in 0..100 (0 closed, 100 open,
mapped onto the jaw's radians with ``lerobot_env_so101.gripper``).

Time: each ``send_action`` advances physics by exactly ``1/fps`` seconds, so sim time
counts control ticks and a seeded episode replays bit for bit.

Beyond the protocol, the sim exposes privileged helpers the product uses for tasks,
scripted demonstrations and latency measurements (``reset``, ``task``, ``reward``,
``is_success``, ``move_target``, ``target_position``, ``ee_position``,
``forward_kinematics``, ``get_state``/``set_state``, ``world``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from robot_rl.hardware.robot import InvalidActionError, Observation, features_for, validate_action
from robot_rl.hardware.sim.config import SimConfig
from robot_rl.hardware.sim.rendering import CameraRenderer, mujoco
from robot_rl.hardware.sim.scene import CUBE_HALF, JOINT_NAMES, SceneIds, build_model
from robot_rl.hardware.sim.so101_package import gripper as gripper_units
from robot_rl.hardware.sim.tasks import (
    PICK_LIFT,
    TaskProgress,
    TaskSpec,
    WorldSnapshot,
    is_success,
    reward,
    sample_cube_spot,
    sample_layout,
    sample_task,
)

# A ready pose: gripper ~11 cm above the table in front of the base, pointing down.
HOME_DEG = np.array([0.0, -40.0, 30.0, 70.0, 0.0, 30.0])
_STATE_SPEC = mujoco.mjtState.mjSTATE_INTEGRATION


@dataclass(frozen=True)
class SimState:
    """A full snapshot: physics (incl. solver warm start) plus episode bookkeeping."""

    physics: np.ndarray
    task: TaskSpec
    progress: TaskProgress
    last_action: np.ndarray
    step: int


class SimSO101:
    """MuJoCo SO-101 on a table with red/green/blue cubes and a bowl."""

    # Its tick is the physics and the rendering, not I/O with a motor bus: no deadline of a real arm
    # is at stake, so the edge gives its loop no real-time priority (``EdgeNode.realtime``), which
    # would put the rendering ahead of the learner and the policy's own thread on the same CPUs.
    simulated = True

    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config or SimConfig()
        self.name = self.config.name
        self.fps = self.config.fps
        self.joint_names: tuple[str, ...] = JOINT_NAMES
        self.camera_names: tuple[str, ...] = tuple(self.config.cameras)
        self.model = build_model(self.config)
        self.data = mujoco.MjData(self.model)
        self.ids = SceneIds.resolve(self.model)
        self._fk_data = mujoco.MjData(self.model)  # scratch: FK never touches self.data
        self._ctrlrange = self.model.actuator_ctrlrange[self.ids.actuators].copy()
        self._gripper_range = self._ctrlrange[-1]
        self._renderer: CameraRenderer | None = None
        self._connected = False
        self._seeds = np.random.default_rng(self.config.seed)
        self._task: TaskSpec | None = None
        self.scene_seed: int | None = None  # the seed of the last reset
        self._progress: TaskProgress | None = None
        self._last_action = HOME_DEG.astype(np.float32)
        self._step = 0

    # ------------------------------------------------------------------ Robot protocol

    @property
    def is_connected(self) -> bool:
        return self._connected

    @property
    def joint_limits(self) -> tuple[np.ndarray, np.ndarray]:
        """Arm limits are the model's actuator ctrlrange in degrees; the gripper 0..100."""
        lower = np.rad2deg(self._ctrlrange[:5, 0])
        upper = np.rad2deg(self._ctrlrange[:5, 1])
        return (
            np.append(lower, 0.0).astype(np.float32),
            np.append(upper, 100.0).astype(np.float32),
        )

    @property
    def observation_features(self) -> dict[str, type | tuple[int, ...]]:
        return self._features()[0]

    @property
    def action_features(self) -> dict[str, type]:
        return self._features()[1]

    def _features(self) -> tuple[dict, dict]:
        size = (self.config.image_height, self.config.image_width)
        return features_for(self.joint_names, {cam: size for cam in self.camera_names})

    def connect(self) -> None:
        """Start the episode machinery; resets to ``config.seed`` if never reset."""
        if self._connected:
            return
        self._renderer = CameraRenderer(self.model, self.config.image_height, self.config.image_width)
        self._connected = True
        if self._task is None:
            self.reset(self.config.seed)

    def disconnect(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        self._connected = False

    def get_observation(self) -> Observation:
        self._require_connected()
        return {"images": self.render(), "state": self.joint_state()}

    def render(self, cameras: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
        """Images of ``cameras`` (default: the configured ones) as uint8 HxWx3."""
        self._require_connected()
        cameras = self.camera_names if cameras is None else tuple(cameras)
        assert self._renderer is not None  # connected
        return self._renderer.render(self.data, cameras) if cameras else {}

    def send_action(self, action: np.ndarray) -> np.ndarray:
        """Clip to limits, set the position servos, advance physics by exactly 1/fps s.

        An invalid action raises InvalidActionError before anything is touched.
        """
        self._require_connected()
        arr = validate_action(action, self.joint_names)
        lower, upper = self.joint_limits
        executed = np.clip(arr, lower, upper).astype(np.float32)
        self.data.ctrl[self.ids.actuators] = self._action_to_ctrl(executed)
        for _ in range(self.config.substeps):
            mujoco.mj_step(self.model, self.data)
        self._last_action = executed
        self._step += 1
        task, progress = self._require_task()
        progress.update(self.world(), task)
        return executed.copy()

    # ------------------------------------------------------------------ units

    def joint_state(self) -> np.ndarray:
        """Measured joints in action units (degrees, gripper 0..100), float32[6]."""
        arm = np.rad2deg(self.data.qpos[self.ids.arm_qpos])
        grip = 100.0 * gripper_units.ctrl_to_normalized(
            self.data.qpos[self.ids.gripper_qpos], self._gripper_range
        )
        return np.append(arm, grip).astype(np.float32)

    def _action_to_ctrl(self, action: np.ndarray) -> np.ndarray:
        arm = np.deg2rad(np.asarray(action[:5], dtype=np.float64))
        grip = gripper_units.normalized_to_ctrl(float(action[5]) / 100.0, self._gripper_range)
        return np.append(arm, grip)

    # ------------------------------------------------------------------ episodes and tasks

    def reset(self, seed: int | None = None, family: str | None = None, color: str | None = None) -> str:
        """New episode: draw task and layout from ``seed``; returns the instruction.

        Fully deterministic given ``seed``. Without a seed one is drawn from a stream
        seeded by ``config.seed``, so a sequence of resets is reproducible too.
        """
        if seed is None:
            seed = int(self._seeds.integers(2**31))
        rng = np.random.default_rng(seed)
        task = sample_task(rng, family, color)
        layout = sample_layout(rng, task)

        mujoco.mj_resetData(self.model, self.data)
        self.data.mocap_pos[self.ids.bowl_mocap] = (*layout.bowl, 0.0)
        for c, (x, y, yaw) in layout.cubes.items():
            self._place_cube(c, np.array([x, y, CUBE_HALF]), yaw)
        noise = rng.uniform(-1.0, 1.0, size=6) * self.config.initial_joint_noise_deg
        noise[5] = 0.0
        start = (HOME_DEG + noise).astype(np.float32)
        ctrl = self._action_to_ctrl(start)
        self.data.qpos[self.ids.arm_qpos] = ctrl[:5]
        self.data.qpos[self.ids.gripper_qpos] = ctrl[5]
        self.data.ctrl[self.ids.actuators] = ctrl
        mujoco.mj_forward(self.model, self.data)

        self._task = task
        self.scene_seed = seed  # recorded with the episode: replay re-creates this scene from it
        self._last_action = start
        self._step = 0
        self._progress = TaskProgress(start_position=self._cube_position(task.color))
        return task.instruction

    @property
    def task(self) -> TaskSpec:
        return self._require_task()[0]

    @property
    def step_count(self) -> int:
        """Control ticks since the last reset."""
        return self._step

    @property
    def sim_time(self) -> float:
        return float(self.data.time)

    @property
    def last_action(self) -> np.ndarray:
        """The last executed (clipped) command; the home pose right after reset."""
        return self._last_action.copy()

    @property
    def progress(self) -> TaskProgress:
        return self._require_task()[1]

    def reward(self) -> float:
        return reward(self.world(), *self._require_task())

    def is_success(self) -> bool:
        return is_success(self.world(), *self._require_task())

    def move_target(self, rng_or_seed: np.random.Generator | int | None = None) -> np.ndarray:
        """Teleport the task's cube to a new free, reachable spot (at rest); return it.

        A perturbation for measuring how fast a policy reacts. The cube is dropped if
        it was held; for push tasks the displacement is measured from the new spot.
        """
        task, _ = self._require_task()
        rng = rng_or_seed if isinstance(rng_or_seed, np.random.Generator) else np.random.default_rng(rng_or_seed)
        current = self._cube_position(task.color)
        others = [self._cube_position(c) for c in self.ids.cube_qpos if c != task.color]
        bowl = self.data.mocap_pos[self.ids.bowl_mocap][:2].copy()
        x, y, yaw = self._free_spot_away_from(current, rng, others, bowl)
        self._place_cube(task.color, np.array([x, y, CUBE_HALF]), yaw)
        mujoco.mj_forward(self.model, self.data)
        new_position = self._cube_position(task.color)
        self._progress = TaskProgress(start_position=new_position.copy())
        return new_position

    def place_cube(self, color: str, position: np.ndarray, yaw: float = 0.0) -> None:
        """Put a cube at ``position`` (world metres) at rest, e.g. to stage a scenario.

        Contacts and derived quantities are recomputed at once, so ``is_success``
        sees the new pose; task progress is not reset (``move_target`` does that).
        """
        if color not in self.ids.cube_qpos:
            raise ValueError(f"no {color!r} cube; the cubes are {tuple(self.ids.cube_qpos)}")
        self._place_cube(color, np.asarray(position, dtype=np.float64), yaw)
        mujoco.mj_forward(self.model, self.data)

    def _free_spot_away_from(
        self, current: np.ndarray, rng: np.random.Generator, others: list[np.ndarray], bowl: np.ndarray
    ) -> tuple[float, float, float]:
        """A free spot >= 5 cm from ``current``; for push tasks one with a clear path if any.

        A policy may have scattered the cubes so that no spot has a clear push path;
        then any free reachable spot is used rather than failing the perturbation.
        """
        for task in (self._task, None):
            try:
                for _ in range(100):
                    x, y, yaw = sample_cube_spot(rng, others, bowl, task)
                    if np.hypot(x - current[0], y - current[1]) > 0.05:
                        return x, y, yaw
            except RuntimeError:
                continue
        raise RuntimeError("move_target found no free reachable spot on the table")

    def target_position(self) -> np.ndarray:
        """Where the gripper should be heading now, in world metres.

        Before the cube is held: the target cube itself (for every family). Once it is
        held: pick - a point PICK_LIFT + 3 cm above where the cube started; place - the
        bowl centre at carrying height.
        """
        task, progress = self._require_task()
        world = self.world()
        cube = world.cube_position[task.color]
        if not world.cube_held[task.color] or task.family == "push":
            return cube
        if task.family == "pick":
            return progress.start_position + np.array([0.0, 0.0, PICK_LIFT + 0.03])
        return world.bowl_position + np.array([0.0, 0.0, 0.06])

    def ee_position(self) -> np.ndarray:
        """World position of the ``gripperframe`` site (on the fixed jaw's inner face)."""
        return self.data.site_xpos[self.ids.ee_site].copy()

    def forward_kinematics(self, action: np.ndarray) -> np.ndarray:
        """``gripperframe`` position if the joints were at ``action`` (clipped); sim untouched."""
        arr = validate_action(action, self.joint_names)
        lower, upper = self.joint_limits
        ctrl = self._action_to_ctrl(np.clip(arr, lower, upper))
        self._fk_data.qpos[self.ids.arm_qpos] = ctrl[:5]
        self._fk_data.qpos[self.ids.gripper_qpos] = ctrl[5]
        mujoco.mj_kinematics(self.model, self._fk_data)
        return self._fk_data.site_xpos[self.ids.ee_site].copy()

    # ------------------------------------------------------------------ snapshots

    def get_state(self) -> SimState:
        task, progress = self._require_task()
        size = mujoco.mj_stateSize(self.model, _STATE_SPEC)
        physics = np.empty(size, dtype=np.float64)
        mujoco.mj_getState(self.model, self.data, physics, _STATE_SPEC)
        return SimState(physics, task, progress.copy(), self._last_action.copy(), self._step)

    def set_state(self, state: SimState) -> None:
        mujoco.mj_setState(self.model, self.data, state.physics, _STATE_SPEC)
        mujoco.mj_forward(self.model, self.data)
        self._task = state.task
        self._progress = state.progress.copy()
        self._last_action = state.last_action.copy()
        self._step = state.step

    def world(self) -> WorldSnapshot:
        """Privileged scene state for tasks and the scripted expert."""
        colors = tuple(self.ids.cube_qpos)
        touching = self._gripper_contacts()
        return WorldSnapshot(
            cube_position={c: self._cube_position(c) for c in colors},
            cube_yaw={c: self._cube_yaw(c) for c in colors},
            cube_speed={c: self._cube_speed(c) for c in colors},
            cube_touches_gripper={c: bool(touching[c]) for c in colors},
            cube_held={c: touching[c] >= {"fixed", "moving"} for c in colors},
            bowl_position=self.data.mocap_pos[self.ids.bowl_mocap].copy(),
            ee_position=self.ee_position(),
            gripper_opening=float(self.joint_state()[5]),
        )

    # ------------------------------------------------------------------ internals

    def _gripper_contacts(self) -> dict[str, set[str]]:
        """Which jaw ("fixed" = gripper body, "moving" = moving jaw) touches each cube."""
        by_geom = {g: c for c, g in self.ids.cube_geom.items()}
        moving_body = self.model.body("moving_jaw_so101_v1").id
        touching: dict[str, set[str]] = {c: set() for c in self.ids.cube_geom}
        for k in range(self.data.ncon):
            g1, g2 = int(self.data.contact[k].geom1), int(self.data.contact[k].geom2)
            for cube_geom, other in ((g1, g2), (g2, g1)):
                if cube_geom in by_geom and other in self.ids.gripper_geoms:
                    side = "moving" if self.model.geom_bodyid[other] == moving_body else "fixed"
                    touching[by_geom[cube_geom]].add(side)
        return touching

    def _place_cube(self, color: str, position: np.ndarray, yaw: float) -> None:
        adr = self.ids.cube_qpos[color]
        self.data.qpos[adr : adr + 3] = position
        self.data.qpos[adr + 3 : adr + 7] = (math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2))
        dof = self.ids.cube_dof[color]
        self.data.qvel[dof : dof + 6] = 0.0

    def _cube_position(self, color: str) -> np.ndarray:
        adr = self.ids.cube_qpos[color]
        return self.data.qpos[adr : adr + 3].copy()

    def _cube_yaw(self, color: str) -> float:
        w, x, y, z = self.data.qpos[self.ids.cube_qpos[color] + 3 : self.ids.cube_qpos[color] + 7]
        return math.atan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))

    def _cube_speed(self, color: str) -> float:
        dof = self.ids.cube_dof[color]
        return float(np.linalg.norm(self.data.qvel[dof : dof + 3]))

    def _require_connected(self) -> None:
        if not self._connected:
            raise RuntimeError(f"{self.name} is not connected; call connect() first")

    def _require_task(self) -> tuple[TaskSpec, TaskProgress]:
        """The episode's task and progress (set together by ``reset``)."""
        if self._task is None or self._progress is None:
            raise RuntimeError(f"{self.name} has no episode yet; call reset() (or connect()) first")
        return self._task, self._progress


__all__ = ["InvalidActionError", "SimSO101", "SimState"]
