"""Any ROS 2 arm as a robot_rl ``Robot``: JointState and camera topics in, joint commands out.

A background executor thread receives messages and keeps only the newest of each (the
control loop wants the present, not a backlog). Joint positions are merged by name, so a
driver that publishes arm and gripper in separate JointState messages works; the state's
age is that of its oldest joint. ``get_observation`` never waits on the network: it returns
the newest state, or raises ``StaleStateError`` when that state is older than
``stale_after_ms`` (a driver that stopped publishing must stop the policy).

QoS: sensor streams (joint states, images) are best-effort, keep-last: a late sample is
useless and must not hold up newer ones (a best-effort reader also matches a reliable
publisher). Commands are reliable, keep-last: a dropped command would leave the arm on
an old target.

Commands: with ``command_type="trajectory"`` each tick publishes this tick's target plus
the rest of the edge's plan (``set_plan_source``) as one JointTrajectory, point i due at
(i+1)/fps, so the controller interpolates smoothly and keeps moving sensibly if a tick is
late. Every point is bounded against the one before it by ``max_joint_velocity`` (the
controller executes the whole plan if no new command comes, so each step of it must be safe).
``"forward"`` publishes the single target as Float64MultiArray.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from robot_rl.bridges.ros2 import messages
from robot_rl.bridges.ros2.config import Ros2ArmConfig
from robot_rl.core.motion_limits import JointDeltaClamp, step_limit_per_tick
from robot_rl.core.robot_io import Observation, RobotFaultError, features_for, validate_action

log = logging.getLogger(__name__)

PlanSource = Callable[[], "list[np.ndarray]"]


class StaleStateError(RobotFaultError):
    """The newest joint state is too old to act on (or none has come yet)."""


class Ros2Robot:
    """Robot protocol over rclpy; see the module docstring."""

    def __init__(self, config: Ros2ArmConfig | None = None) -> None:
        self.config = config or Ros2ArmConfig()
        self.name = self.config.name
        self.fps = self.config.fps
        self.joint_names = tuple(self.config.joint_names)
        self._cameras = self.config.camera_configs()
        self.camera_names = tuple(self._cameras)
        n = len(self.joint_names)
        self._scale = np.asarray(self.config.scale or [1.0] * n, dtype=np.float64)
        self._offset = np.asarray(self.config.offset or [0.0] * n, dtype=np.float64)
        self._lower, self._upper = self._limits()
        self._plan_source: PlanSource | None = None
        self._step_clamp = JointDeltaClamp(step_limit_per_tick(self.config.max_joint_velocity, self.fps, None, n), n)
        self._lock = threading.Lock()
        self._positions: dict[str, float] = {}  # ROS units, merged by name across JointState messages
        self._position_times: dict[str, float] = {}
        self._images: dict[str, np.ndarray] = {}
        self._image_errors = 0
        # rclpy's objects (imported at connect, so the config works without ROS 2 installed).
        self._context: Any = None
        self._node: Any = None
        self._executor: Any = None
        self._thread: threading.Thread | None = None
        self._publisher: Any = None

    # -- description -----------------------------------------------------------------

    @property
    def is_connected(self) -> bool:
        return self._node is not None

    @property
    def joint_limits(self) -> tuple[np.ndarray, np.ndarray]:
        return self._lower, self._upper

    @property
    def max_joint_velocity(self) -> Any:
        """Action units per second (the edge bounds every target by it)."""
        return self.config.max_joint_velocity

    @property
    def camera_shapes(self) -> dict[str, tuple[int, int]]:
        return {name: (cam.height, cam.width) for name, cam in self._cameras.items()}

    @property
    def observation_features(self) -> dict:
        return features_for(self.joint_names, self.camera_shapes)[0]

    @property
    def action_features(self) -> dict:
        return features_for(self.joint_names, self.camera_shapes)[1]

    def set_plan_source(self, source: PlanSource | None) -> None:
        """Where the upcoming planned actions come from (e.g. the edge's action queue)."""
        self._plan_source = source

    # -- life cycle -------------------------------------------------------------------

    def connect(self) -> None:
        if self.is_connected:
            return
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor

        self._context = Context()
        rclpy.init(context=self._context, domain_id=self.config.domain_id)
        try:
            self._node = rclpy.create_node(self.config.node_name, context=self._context)
            self._create_endpoints()
            self._executor = SingleThreadedExecutor(context=self._context)
            self._executor.add_node(self._node)
            self._thread = threading.Thread(target=self._spin, name=f"ros2-{self.name}", daemon=True)
            self._thread.start()
            self._wait_for_first_messages()
        except BaseException:
            self.disconnect()
            raise
        log.info("connected to ROS 2 arm %r (%s -> %s)", self.name, self.config.joint_state_topic,
                 self.config.command_topic)

    def disconnect(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(timeout_sec=1.0)
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        if self._node is not None:
            self._node.destroy_node()
        if self._context is not None and self._context.ok():
            self._context.try_shutdown()
        self._node = self._executor = self._thread = self._context = self._publisher = None
        with self._lock:
            self._positions.clear()
            self._position_times.clear()
            self._images.clear()

    # -- I/O --------------------------------------------------------------------------

    def get_observation(self) -> Observation:
        self._require_connected()
        with self._lock:
            state, received, images = self._merged_state(), self._state_time(), dict(self._images)
        if state is None:
            missing = [j for j in self.joint_names if j not in self._positions]
            raise StaleStateError(f"no JointState received yet on {self.config.joint_state_topic} for {missing}")
        age_ms = (time.monotonic() - received) * 1000.0
        if age_ms > self.config.stale_after_ms:
            raise StaleStateError(
                f"newest JointState on {self.config.joint_state_topic} is {age_ms:.0f} ms old "
                f"(limit {self.config.stale_after_ms:.0f} ms); is the arm's driver running?"
            )
        missing = [c for c in self.camera_names if c not in images]
        if missing:
            raise RuntimeError(f"no image received yet from cameras {missing}")
        return {"images": images, "state": state.astype(np.float32)}

    def send_action(self, action: np.ndarray) -> np.ndarray:
        self._require_connected()
        target = np.clip(validate_action(action, self.joint_names), self._lower, self._upper).astype(np.float32)
        if self.config.command_type == "forward":
            self._publisher.publish(messages.forward_command(self._to_ros(target)))
            return target
        points = [target, *self._step_clamp.along(target, self._planned())]
        ros_points = np.stack([self._to_ros(p) for p in points[: self.config.max_plan_points]])
        self._publisher.publish(messages.trajectory(self.joint_names, ros_points, 1.0 / self.fps))
        return target

    # -- internals --------------------------------------------------------------------

    def _create_endpoints(self) -> None:
        from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
        from sensor_msgs.msg import CompressedImage, Image, JointState
        from std_msgs.msg import Float64MultiArray
        from trajectory_msgs.msg import JointTrajectory

        node = self._node
        node.create_subscription(JointState, self.config.joint_state_topic, self._on_joint_state,
                                 qos_profile_sensor_data)
        for name, cam in self._cameras.items():
            msg_type = CompressedImage if cam.compressed else Image
            node.create_subscription(msg_type, cam.topic, self._image_callback(name, cam.compressed),
                                     qos_profile_sensor_data)
        command_qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)
        msg_type = JointTrajectory if self.config.command_type == "trajectory" else Float64MultiArray
        self._publisher = node.create_publisher(msg_type, self.config.command_topic, command_qos)

    def _spin(self) -> None:
        try:
            self._executor.spin()
        except Exception:  # the executor raises on shutdown races; nothing to do but stop
            log.debug("ROS 2 executor of %s stopped", self.name, exc_info=True)

    def _wait_for_first_messages(self) -> None:
        deadline = time.monotonic() + self.config.connect_timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                ready = self._merged_state() is not None and all(c in self._images for c in self.camera_names)
            # Commands published before the controller's subscription is matched are lost.
            if ready and self._publisher.get_subscription_count() > 0:
                return
            time.sleep(0.01)
        with self._lock:
            have_state = self._merged_state() is not None
            missing = [self._cameras[c].topic for c in self.camera_names if c not in self._images]
        state = f"JointState on {self.config.joint_state_topic} with joints {list(self.joint_names)}"
        what = [] if have_state else [state]
        what += [f"images on {t}" for t in missing]
        if self._publisher.get_subscription_count() == 0:
            what.append(f"a controller subscribed to {self.config.command_topic}")
        raise TimeoutError(
            f"ROS 2 arm {self.name!r}: nothing received within {self.config.connect_timeout_s} s: {'; '.join(what)}. "
            "Check the topic names, ROS_DOMAIN_ID and that the driver is running (ros2 topic list)."
        )

    def _on_joint_state(self, msg) -> None:
        positions = messages.joint_positions(msg, self.joint_names)
        if not positions:
            return  # a JointState for other joints only
        now = time.monotonic()
        with self._lock:
            self._positions.update(positions)
            self._position_times.update(dict.fromkeys(positions, now))

    def _merged_state(self) -> np.ndarray | None:
        """The joint vector in action units once every joint has been heard of (lock held)."""
        if len(self._positions) < len(self.joint_names):
            return None
        ros = np.array([self._positions[j] for j in self.joint_names], dtype=np.float64)
        return ros * self._scale + self._offset

    def _state_time(self) -> float:
        """When the oldest joint of the state was last heard of (lock held)."""
        return min(self._position_times.get(j, 0.0) for j in self.joint_names)

    def _image_callback(self, name: str, compressed: bool) -> Callable:
        def callback(msg) -> None:
            try:
                rgb = messages.compressed_to_rgb(msg) if compressed else messages.image_to_rgb(msg)
            except ValueError as exc:
                self._image_errors += 1
                if self._image_errors <= 3:
                    log.error("camera %s: %s", name, exc)
                return
            with self._lock:
                self._images[name] = rgb

        return callback

    def _planned(self) -> list[np.ndarray]:
        if self._plan_source is None:
            return []
        return [np.clip(np.asarray(a, dtype=np.float32), self._lower, self._upper) for a in self._plan_source()]

    def _to_ros(self, action: np.ndarray) -> np.ndarray:
        return (np.asarray(action, dtype=np.float64) - self._offset) / self._scale

    def _limits(self) -> tuple[np.ndarray, np.ndarray]:
        n = len(self.joint_names)
        lower = np.full(n, -np.inf, dtype=np.float32)
        upper = np.full(n, np.inf, dtype=np.float32)
        for i, joint in enumerate(self.joint_names):
            if self.config.joint_limits and joint in self.config.joint_limits:
                lower[i], upper[i] = self.config.joint_limits[joint]
        return lower, upper

    def _require_connected(self) -> None:
        if not self.is_connected:
            raise RuntimeError(f"ROS 2 arm {self.name!r} is not connected; call connect() first")
