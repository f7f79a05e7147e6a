"""``ScriptedExpert``: an IK demonstrator that reads privileged sim state.

It is used as the demonstrator for datasets and as the simulated human operator who
takes over mid-episode, so it keeps no phase memory: every ``act()`` looks at the
world (cube, bowl, jaws, whether the cube is pinched) and decides afresh what to do.
A dropped cube, a cube teleported by ``move_target`` or an arm left anywhere by a
policy are all handled by the same rules.

Motion is planned from the last *commanded* joints, not the measured ones: the
commanded pose is what the servos are converging to, so stepping from it gives a
smooth command stream. Each tick the grasp point (between the fingertip pads) moves
at most ``cartesian_step`` metres in a straight line, the package's Levenberg-Marquardt
IK (gripper pointing straight down, jaws turned to the cube's faces) turns that into
joint targets, and every joint then moves at most ``max_joint_step`` degrees per tick
(STS3215 servos at 30 Hz; the gripper gets the same bound in its 0..100 units).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import numpy as np

from robot_rl.hardware.sim.rendering import mujoco
from robot_rl.hardware.sim.robot import HOME_DEG, SimSO101
from robot_rl.hardware.sim.scene import CUBE_HALF, JAW_PADS, PAN_AXIS_XY
from robot_rl.hardware.sim.so101_package import ik_control
from robot_rl.hardware.sim.tasks import PICK_LIFT, PUSH_DISTANCE, WorldSnapshot, bowl_top_z, in_bowl

# Heights of the grasp point above the table (z = 0), metres.
Z_GRASP = CUBE_HALF + 0.004  # pads pinch the cube a little above its middle
Z_HOVER = 0.075
Z_PUSH = 0.014
PUSH_START_GAP = 0.04  # cube centre to jaw tip when the push starts
# Cube centre ahead of the *commanded* jaw tip while a push rides it: 16-23 mm measured
# (the servos lag the command); the smaller end keeps a planned stroke from outrunning it.
PUSH_CONTACT_GAP = 0.016
PUSH_CARRY_REACH = 0.08  # m a planned tip may be past a stale cube and still be pushing it
Z_CARRY_RISE = PICK_LIFT + 0.03  # cube rise while carried: clears cubes and bowl walls
Z_RELEASE_GAP = 0.006  # cube bottom above the bowl floor when it is let go

GRIPPER_OPEN = 45.0  # ~65 mm between pads: a 30 mm cube with margin, yet not wide
GRIPPER_RELEASE = 60.0
GRIPPER_CLOSED = 0.0
OPEN_ENOUGH = 38.0  # measured opening below which the jaws are not ready to descend
CLOSED_ON_NOTHING = 6.0  # measured opening of jaws that closed and missed the cube
# IK residual (m, tilt included) above which the current arm branch is given up.
IK_BRANCH_ERROR = 0.005
GRASP_CLEARANCE = 0.004  # m between the fixed pad and the cube before closing
# Wrist-roll range (degrees) the expert turns the jaws within, well inside the joint's
# +-157/163 degrees so that it never winds up against a stop chasing a spinning cube.
ROLL_SAFE_DEG = 110.0

_APPROACH_AXIS = 0  # gripperframe x runs out of the gripper along the jaws
_JAW_AXIS = 2  # gripperframe z runs from the fixed jaw to the moving jaw


def kinematic_copy(model: mujoco.MjModel) -> mujoco.MjModel:
    """``model`` with contacts and constraints off, for the expert's IK and FK only.

    The package's IK calls ``mj_forward`` at each of its up to 150 iterations; on the full
    cell that is mostly collision detection among 41 geoms (~32 us), without it ~3 us.
    The IK reads only site poses and Jacobians, which contacts do not change, so the
    commands are the same to the bit (tests/test_sim_expert.py) and cost ~1.3x less time
    (``robot-rl bench sim``).
    """
    kinematic = copy.deepcopy(model)
    kinematic.opt.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_CONTACT) | int(
        mujoco.mjtDisableBit.mjDSBL_CONSTRAINT
    )
    return kinematic


@dataclass(frozen=True)
class Goal:
    """Where the grasp point should go, how the jaws should face, what the gripper does."""

    position: np.ndarray
    jaw_directions: tuple[np.ndarray, ...]  # acceptable jaw-axis directions (xy)
    gripper: float
    careful: bool = False  # slow straight-line motion near the cube
    point: str = "grasp"  # which point of the gripper ``position`` is for: "grasp" or "tip"


class ScriptedExpert:
    """Stateless-by-design pick / push / place controller for ``SimSO101``."""

    def __init__(
        self,
        robot: SimSO101,
        max_joint_step: float = 6.0,
        cartesian_step: float = 0.012,
        careful_step: float = 0.006,
        contact_free_ik: bool = True,  # False: IK on the live model (the same commands, slower)
    ) -> None:
        self.robot = robot
        self.max_joint_step = max_joint_step
        self.cartesian_step = cartesian_step
        self.careful_step = careful_step
        self._model = kinematic_copy(robot.model) if contact_free_ik else robot.model
        self._scratch = mujoco.MjData(self._model)  # IK/FK workspace; never the live sim
        self._plan_pose = mujoco.MjData(self._model)  # the kinematic arm plan_chunk steps along
        self._ids = robot.ids
        self._offsets = {"grasp": self._grasp_point_offset(), "tip": self._tip_offset()}

    def reset(self) -> None:
        """Nothing to forget: the expert keeps no episode memory (kept for symmetry)."""

    # ------------------------------------------------------------------ public

    def act(self) -> np.ndarray:
        """The next command (float32[6], robot action units), re-planned from now."""
        goal = self._plan(self.robot.world(), self.robot.data)
        reference = self.robot.last_action
        target = self._solve(reference, goal)
        return self._rate_limit(reference, target)

    def moving_freely(self) -> bool:
        """Whether the gripper is travelling between waypoints (a held cube's way over to the bowl
        included), not working near a cube or the bowl (descending, closing, pushing, lifting,
        lowering, releasing: the goals it moves slowly to). A disturbance while travelling costs a
        correction; one while working can knock a cube away or close the jaws on air."""
        return not self._plan(self.robot.world(), self.robot.data).careful

    def plan_chunk(self, start: np.ndarray, horizon: int) -> np.ndarray:
        """``horizon`` commands planned from the commanded pose ``start`` (e.g. a rolled-forward state).

        Each step decides afresh what to do, as ``act`` does, but from where the previous
        planned command puts the gripper (forward kinematics), not from the live arm: the
        chunk is the expert's own continuation of ``start``, phase changes included (over
        the cube -> down -> push), so it never idles at a waypoint until the next chunk.
        The world (cube, jaws' opening) is read once, now. Contacts are not simulated; the
        one the plan cannot do without is the push itself: a cube in front of the planned
        jaws is carried along with them (``_pushed_along``), else the plan would push
        through where the cube was and turn back for it. Whether the push is finished is
        judged on the real cube only: a modelled cube that ran ahead of the real one would
        lift the jaws too early and cost a second approach.
        """
        world = self.robot.world()
        pushing = self.robot.task.family == "push"
        push_done = pushing and self._push_done(world)
        plan_pose = self._plan_pose
        reference = np.asarray(start, dtype=np.float32).copy()
        commands = []
        for _ in range(horizon):
            plan_pose.qpos[self._ids.arm_qpos] = np.deg2rad(reference[:5])
            mujoco.mj_kinematics(self._model, plan_pose)
            if pushing:
                world = self._pushed_along(world, self._point(plan_pose, "tip"))
            goal = self._plan(world, plan_pose, push_done)
            reference = self._rate_limit(reference, self._solve(reference, goal))
            commands.append(reference)
        return np.stack(commands).astype(np.float32)

    def _pushed_along(self, world: WorldSnapshot, tip: np.ndarray) -> WorldSnapshot:
        """``world`` with the push cube carried ahead of jaws that are low and in line with it.

        Low jaws in line with the cube that have reached it (or gone past where the world
        last saw it: a rolled-forward start is ahead of a stale snapshot by up to one
        inference of pushing) can only have pushed it, so the cube is put
        ``PUSH_CONTACT_GAP`` ahead of the tip along the push direction, in line with it
        (kinematic: no sliding, no spin), where it rides during a real push.
        """
        task = self.robot.task
        d = task.push_vector
        n = np.array([-d[1], d[0]])
        cube = world.cube_position[task.color]
        rel = tip[:2] - cube[:2]
        along, across = float(rel @ d), float(rel @ n)
        if tip[2] >= Z_PUSH + 0.012 or abs(across) >= 0.012 or not -PUSH_CONTACT_GAP < along < PUSH_CARRY_REACH:
            return world
        moved = cube.copy()
        moved[:2] = tip[:2] + d * PUSH_CONTACT_GAP  # flat jaws: the cube also follows any sideways drift
        return replace(world, cube_position={**world.cube_position, task.color: moved})

    def _plan(self, world: WorldSnapshot, arm: mujoco.MjData, push_done: bool | None = None) -> Goal:
        """The goal for the gripper posed as in ``arm`` (the live sim, or a planned pose).

        ``push_done`` overrides judging the push finished from ``world`` (see ``plan_chunk``).
        """
        task = self.robot.task
        if task.family == "push":
            done = self._push_done(world) if push_done is None else push_done
            return self._plan_push(world, self._point(arm, "tip"), done)
        p = self._point(arm, "grasp")
        color = task.color
        cube = world.cube_position[color]
        if world.cube_held[color]:
            return self._plan_carry(world, p, cube)
        if task.family == "place" and in_bowl(world, color):
            return self._go_up(p, GRIPPER_RELEASE, _face_directions(world.cube_yaw[color]))
        return self._plan_grasp(world, p, cube)

    def _plan_grasp(self, world: WorldSnapshot, p: np.ndarray, cube: np.ndarray) -> Goal:
        """Hover over the cube with open jaws, descend, close; re-open if they missed."""
        color = self.robot.task.color
        faces = _face_directions(world.cube_yaw[color])
        grasp = np.array([cube[0], cube[1], Z_GRASP + cube[2] - CUBE_HALF])
        xy_error = float(np.linalg.norm(p[:2] - cube[:2]))
        height = float(p[2] - grasp[2])
        opening = world.gripper_opening
        if xy_error < 0.008 and abs(height) < 0.008:
            if opening < CLOSED_ON_NOTHING:  # closed on air: back up and retry
                return self._go_up(p, GRIPPER_OPEN, faces)
            return Goal(grasp, faces, GRIPPER_CLOSED, careful=True)
        if world.cube_touches_gripper[color] and height > 0.012:  # landed on the cube
            return self._go_up(p, GRIPPER_OPEN, faces)
        in_funnel = xy_error < 0.006 + 0.35 * max(height, 0.0)
        if in_funnel and opening >= OPEN_ENOUGH:
            return Goal(grasp, faces, GRIPPER_OPEN, careful=True)
        hover_z = max(_hover_height(cube), grasp[2] + 0.03)
        if not in_funnel and p[2] < hover_z - 0.02 and xy_error > 0.03:
            return self._go_up(p, GRIPPER_OPEN, faces)
        hover = np.array([cube[0], cube[1], hover_z])
        return Goal(hover, faces, GRIPPER_OPEN)

    def _plan_carry(self, world: WorldSnapshot, p: np.ndarray, cube: np.ndarray) -> Goal:
        """Held cube: pick lifts it; place carries it over the bowl, lowers, lets go.

        Targets are for the cube and shifted onto the grasp point by the cube's offset
        in the jaws, so a cube that slipped a little is still placed accurately.
        """
        task = self.robot.task
        faces = _face_directions(world.cube_yaw[task.color])
        start = self.robot.progress.start_position
        to_grasp = p - cube
        if task.family == "pick":
            lifted = np.array([cube[0], cube[1], start[2] + Z_CARRY_RISE])
            return Goal(lifted + to_grasp, faces, GRIPPER_CLOSED, careful=True)
        bowl = world.bowl_position
        rest_z = bowl_top_z(world) + CUBE_HALF
        carry = np.array([bowl[0], bowl[1], rest_z + Z_CARRY_RISE])
        xy_error = float(np.linalg.norm(cube[:2] - bowl[:2]))
        if xy_error > 0.012 + 0.3 * max(cube[2] - rest_z, 0.0):
            if cube[2] < rest_z + Z_CARRY_RISE - 0.02 and xy_error > 0.03:
                return Goal(np.array([*cube[:2], carry[2]]) + to_grasp, faces, GRIPPER_CLOSED, careful=True)
            return Goal(carry + to_grasp, faces, GRIPPER_CLOSED)
        release = np.array([bowl[0], bowl[1], rest_z + Z_RELEASE_GAP])
        if cube[2] < release[2] + 0.004:
            return Goal(p.copy(), faces, GRIPPER_RELEASE, careful=True)
        return Goal(release + to_grasp, faces, GRIPPER_CLOSED, careful=True)

    def _push_done(self, world: WorldSnapshot) -> bool:
        """The cube has gone the push distance, with a margin (then the jaws lift away)."""
        task = self.robot.task
        moved = world.cube_position[task.color][:2] - self.robot.progress.start_position[:2]
        return float(moved @ task.push_vector) >= PUSH_DISTANCE + 0.012

    def _plan_push(self, world: WorldSnapshot, p: np.ndarray, done: bool) -> Goal:
        """Closed jaws down behind the cube, then slide it along the table.

        ``p`` is the tip of the closed jaws; the jaw axis is held across the push
        direction so the flat sides of both jaws meet the cube.
        """
        task = self.robot.task
        d = task.push_vector
        n = np.array([-d[1], d[0]])
        cube = world.cube_position[task.color]
        jaw = (n, -n)
        if done:
            return self._go_up(p, GRIPPER_CLOSED, jaw, point="tip")
        rel = p[:2] - cube[:2]
        along, across = float(rel @ d), float(rel @ n)
        low = p[2] < Z_PUSH + 0.012
        if low and -0.07 < along < -0.012 and abs(across) < 0.012:
            ahead = np.array([*(cube[:2] + d * 0.05), Z_PUSH])
            return Goal(ahead, jaw, GRIPPER_CLOSED, careful=True, point="tip")
        behind = np.array([*(cube[:2] - d * PUSH_START_GAP), Z_PUSH])
        xy_error = float(np.linalg.norm(p[:2] - behind[:2]))
        height = float(p[2] - Z_PUSH)
        if xy_error < 0.006 + 0.35 * max(height, 0.0):
            return Goal(behind, jaw, GRIPPER_CLOSED, careful=True, point="tip")
        if p[2] < Z_HOVER - 0.02 and xy_error > 0.03:
            return self._go_up(p, GRIPPER_CLOSED, jaw, point="tip")
        return Goal(np.array([*behind[:2], Z_HOVER]), jaw, GRIPPER_CLOSED, point="tip")

    def _go_up(
        self, p: np.ndarray, gripper: float, jaw: tuple[np.ndarray, ...], point: str = "grasp"
    ) -> Goal:
        return Goal(np.array([p[0], p[1], max(Z_HOVER, p[2])]), jaw, gripper, careful=True, point=point)

    # ------------------------------------------------------------------ IK and limits

    def _solve(self, reference: np.ndarray, goal: Goal) -> np.ndarray:
        """Joint command (action units) one Cartesian step from ``reference`` toward ``goal``.

        The IK starts from the commanded pose, so consecutive commands stay on one
        branch. If that branch cannot hold the gripper down at the waypoint (a policy
        may have left the elbow folded the wrong way), it restarts from the ready pose.
        """
        data = self._scratch
        data.qpos[self._ids.arm_qpos] = np.deg2rad(reference[:5])
        mujoco.mj_kinematics(self._model, data)
        start = self._point(data, goal.point)
        step = self.careful_step if goal.careful else self.cartesian_step
        delta = goal.position - start
        dist = float(np.linalg.norm(delta))
        waypoint = goal.position if dist <= step else start + delta * (step / dist)

        q, error = self._ik(np.deg2rad(reference[:5]), waypoint, goal)
        if error > IK_BRANCH_ERROR:
            ready = np.deg2rad(HOME_DEG[:5]).copy()
            rel = waypoint[:2] - PAN_AXIS_XY
            ready[0] = -np.arctan2(rel[1], rel[0])  # the pan joint's axis points down
            q_ready, error_ready = self._ik(ready, waypoint, goal, iterations=150)
            if error_ready < error:
                q = q_ready
        return np.append(np.rad2deg(q), goal.gripper).astype(np.float32)

    def _ik(
        self, seed: np.ndarray, waypoint: np.ndarray, goal: Goal, iterations: int = 20
    ) -> tuple[np.ndarray, float]:
        """Top-down IK from ``seed`` (radians); returns the solution and its residual.

        The residual adds metres of position error to the gripper's tilt from vertical
        weighted like the solver does (0.1 m per radian).
        """
        data = self._scratch
        data.qpos[self._ids.arm_qpos] = seed
        mujoco.mj_kinematics(self._model, data)
        seed = seed.copy()
        seed[4] = self._roll_for_jaws(data, seed[4], goal.jaw_directions)
        offset = self._offsets[goal.point]
        q = ik_control.solve_ik(
            self._model,
            data,
            self._ids.ee_site,
            self._ids.arm_dofs,
            waypoint,
            seed_q=seed,
            point_offset=offset,
            approach_axis=_APPROACH_AXIS,
            ik_iterations=iterations,
        )
        data.qpos[self._ids.arm_qpos] = q
        mujoco.mj_kinematics(self._model, data)
        position_error = float(np.linalg.norm(self._point(data, goal.point) - waypoint))
        tilt = ik_control.approach_tilt(data, self._ids.ee_site, _APPROACH_AXIS)
        return q, position_error + ik_control.DEFAULT_ORIENTATION_WEIGHT * tilt

    def _roll_for_jaws(self, data: mujoco.MjData, roll: float, directions: tuple[np.ndarray, ...]) -> float:
        """Wrist roll (rad) lining the jaw axis up with one of ``directions``.

        Picks the smallest turn that stays within +-ROLL_SAFE_DEG.
        """
        limit = np.deg2rad(ROLL_SAFE_DEG)
        candidates = []
        for d in directions:
            delta = ik_control.roll_to_align_axis(
                data, self._ids.ee_site, self._ids.roll_joint, _JAW_AXIS, np.array([d[0], d[1], 0.0])
            )
            for turn in (delta, delta + 2 * np.pi, delta - 2 * np.pi):
                if abs(roll + turn) <= limit:
                    candidates.append(turn)
        if not candidates:
            return float(np.clip(roll, -limit, limit))
        return float(roll + min(candidates, key=abs))

    def _rate_limit(self, reference: np.ndarray, target: np.ndarray) -> np.ndarray:
        step = np.clip(target - reference, -self.max_joint_step, self.max_joint_step)
        lower, upper = self.robot.joint_limits
        return np.clip(reference + step, lower, upper).astype(np.float32)

    # ------------------------------------------------------------------ geometry

    def _point(self, data: mujoco.MjData, which: str) -> np.ndarray:
        """World position of the "grasp" point or the closed-jaw "tip" for ``data``'s pose."""
        return ik_control.control_point(data, self._ids.ee_site, self._offsets[which])

    def _tip_offset(self) -> np.ndarray:
        """Centre of the fixed fingertip pad (site frame): the closed jaws' tip, for pushing."""
        data = self._scratch
        data.qpos[:] = self._model.qpos0
        mujoco.mj_kinematics(self._model, data)
        site = self._ids.ee_site
        pad = self._model.geom(JAW_PADS[0]).id
        return data.site_xmat[site].reshape(3, 3).T @ (data.geom_xpos[pad] - data.site_xpos[site])

    def _grasp_point_offset(self) -> np.ndarray:
        """Grasp point in the ``gripperframe`` site frame: where the cube centre should be.

        It sits level with the fixed fingertip pad, one cube half-width plus a few
        millimetres in from the pad's inner face. Closing the moving jaw then slides
        the cube those millimetres onto the fixed pad, and the fixed jaw never lands on
        the cube's top during the descent.
        """
        data = self._scratch
        data.qpos[:] = self._model.qpos0
        mujoco.mj_kinematics(self._model, data)
        site = self._ids.ee_site
        pad = self._model.geom(JAW_PADS[0])
        rotation = data.site_xmat[site].reshape(3, 3)
        pad_center = rotation.T @ (data.geom_xpos[pad.id] - data.site_xpos[site])
        pad_axes = rotation.T @ data.geom_xmat[pad.id].reshape(3, 3)
        # Half-thickness of the pad along the jaw axis (site z).
        half_thickness = float(np.abs(pad_axes[_JAW_AXIS]) @ self._model.geom_size[pad.id])
        offset = pad_center.copy()
        offset[_JAW_AXIS] += half_thickness + CUBE_HALF + GRASP_CLEARANCE
        return offset


def _hover_height(xy: np.ndarray) -> float:
    """Hover lower over far cubes: near the edge of reach a vertical gripper cannot be
    held high (the wrist runs into its limit), only close to the table."""
    radius = float(np.linalg.norm(np.asarray(xy)[:2] - PAN_AXIS_XY))
    return Z_HOVER - 0.6 * max(radius - 0.22, 0.0)


def _face_directions(yaw: float) -> tuple[np.ndarray, ...]:
    """The four horizontal face normals of a cube yawed by ``yaw`` (jaws may close on any pair)."""
    c, s = np.cos(yaw), np.sin(yaw)
    return (np.array([c, s]), np.array([-c, -s]), np.array([-s, c]), np.array([s, -c]))
