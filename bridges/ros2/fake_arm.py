"""A stand-in ROS 2 arm driver for dry runs and tests: ``python -m robot_rl.bridges.ros2.fake_arm``.

It behaves like a position-controlled arm behind ros2_control, without any hardware:
publishes ``sensor_msgs/JointState`` (reliable, as joint_state_broadcaster does) and a
camera image at ``--rate`` Hz, accepts ``JointTrajectory`` or ``Float64MultiArray``
commands and moves to the first commanded point at once (a kinematic arm). Every command
it receives is printed to stdout as one JSON line, so a test in another process can check
exactly what went over the wire.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--joints", default="joint1,joint2,joint3,joint4,joint5,gripper")
    parser.add_argument("--start", type=float, nargs="*", default=None, help="initial joint positions")
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--joint-state-topic", default="/joint_states")
    parser.add_argument("--command-topic", default="/arm_controller/joint_trajectory")
    parser.add_argument("--command-type", choices=("trajectory", "forward"), default="trajectory")
    parser.add_argument("--image-topic", default="/camera/image_raw")
    parser.add_argument("--compressed-topic", default="/camera/image_raw/compressed")
    parser.add_argument("--image-size", type=int, nargs=2, default=(24, 32), metavar=("H", "W"))
    parser.add_argument("--split", action="store_true",
                        help="publish the last joint (the gripper) in a JointState of its own, as some drivers do")
    parser.add_argument("--silent-after", type=float, default=None, metavar="S",
                        help="stop publishing joint states S seconds after the first command (a driver that hangs)")
    args = parser.parse_args(argv)

    import cv2
    import rclpy
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import CompressedImage, Image, JointState
    from std_msgs.msg import Float64MultiArray
    from trajectory_msgs.msg import JointTrajectory

    from robot_rl.bridges.ros2 import messages

    joints = args.joints.split(",")
    position = np.array(args.start if args.start else [0.0] * len(joints), dtype=np.float64)
    h, w = args.image_size
    frame = np.zeros((h, w, 3), dtype=np.uint8)
    frame[..., 0] = 200  # red in RGB: the receiver must keep channel order
    _, jpeg = cv2.imencode(".png", cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))

    rclpy.init()
    node = rclpy.create_node("fake_arm")
    reliable = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
    state_pub = node.create_publisher(JointState, args.joint_state_topic, reliable)
    image_pub = node.create_publisher(Image, args.image_topic, reliable)
    compressed_pub = node.create_publisher(CompressedImage, args.compressed_topic, reliable)

    def report(record: dict) -> None:
        print(json.dumps(record), flush=True)

    first_command: list[float] = []  # monotonic time of the first command received

    def commanded() -> None:
        if not first_command:
            first_command.append(time.monotonic())

    def on_trajectory(msg: JointTrajectory) -> None:
        nonlocal position
        index = [msg.joint_names.index(j) for j in joints]
        points = [[p.positions[i] for i in index] for p in msg.points]
        commanded()
        if points:
            position = np.array(points[0], dtype=np.float64)
        report({"type": "trajectory", "joint_names": list(msg.joint_names), "points": points,
                "time_from_start": [messages.duration_s(p.time_from_start) for p in msg.points],
                "stamp": [msg.header.stamp.sec, msg.header.stamp.nanosec]})

    def on_forward(msg: Float64MultiArray) -> None:
        nonlocal position
        commanded()
        position = np.array(msg.data, dtype=np.float64)
        report({"type": "forward", "data": list(msg.data)})

    if args.command_type == "trajectory":
        node.create_subscription(JointTrajectory, args.command_topic, on_trajectory, reliable)
    else:
        node.create_subscription(Float64MultiArray, args.command_topic, on_forward, reliable)

    def joint_state(names: list[str], values: list[float]) -> JointState:
        state = JointState()
        state.header.stamp = node.get_clock().now().to_msg()
        # Reversed order on purpose: drivers do not publish in the order a config lists.
        state.name = list(reversed(names))
        state.position = list(reversed(values))
        return state

    def publish() -> None:
        if args.silent_after is not None and first_command and time.monotonic() - first_command[0] > args.silent_after:
            return  # hung: no joint states (nor images) any more
        values = position.tolist()
        if args.split:
            state_pub.publish(joint_state(joints[:-1], values[:-1]))
            state_pub.publish(joint_state(joints[-1:], values[-1:]))
        else:
            state_pub.publish(joint_state(joints, values))
        image_pub.publish(messages.rgb_to_image(frame))
        compressed = CompressedImage()
        compressed.format = "png"
        compressed.data = jpeg.tobytes()
        compressed_pub.publish(compressed)

    node.create_timer(1.0 / args.rate, publish)
    report({"type": "ready", "joints": joints})
    try:
        rclpy.spin(node)
    except (KeyboardInterrupt, rclpy.executors.ExternalShutdownException):
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
