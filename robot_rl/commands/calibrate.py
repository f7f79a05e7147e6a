"""`robot-rl calibrate`: camera intrinsics, latency, motors."""

from __future__ import annotations

import argparse
import dataclasses
import glob
import logging
import sys

from robot_rl.app.policies import load_policy
from robot_rl.calibration.latency import (
    LatencyCalibrationError,
    StepTestConfig,
    calibrate_latency,
    default_latency_path,
)
from robot_rl.calibration.motors import NoRobotError, calibrate_motors
from robot_rl.config import load_config
from robot_rl.core.clock import WallClock
from robot_rl.core.registry import ROBOTS
from robot_rl.hardware.lerobot_robot_config import LeRobotRobotConfig

HELP = """\
one calibration of a robot cell: camera, latency or motors.

  camera   ChArUco intrinsics from board images (--images, --out, --squares X Y, --square-m,
           --marker-m, --dictionary); reads no configuration
  latency  command-to-motion delay, camera frame age and inference latency on the configured
           robot; writes the delay prior and the command lag that sessions on that robot then use
           (--out, --joint, --step, --trials, --inference-runs); inference is timed for policy.path,
           or a policy without weights
  motors   LeRobot's motor calibration of the configured LeRobot robot (robot=so101 ...)
Options with dashes belong to the calibration; key=value arguments are configuration overrides.

examples:
  robot-rl calibrate camera --images 'shots/*.png' --out calib/front.yaml
  robot-rl calibrate latency robot=so101 policy.path=outputs/bc_policy   # -> outputs/calibration/follower/latency.yaml
  robot-rl calibrate motors robot=so101 robot.port=/dev/ttyACM0
"""

# The root config groups this command reads (latency and motors; camera reads none).
GROUPS: tuple[str, ...] = ("robot", "policy", "session")

log = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="robot-rl calibrate", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    cam = sub.add_parser("camera", help="ChArUco intrinsics from board images")
    cam.add_argument("--images", required=True, nargs="+", help="image files or glob patterns")
    cam.add_argument("--out", default="outputs/calibration/camera.yaml")
    cam.add_argument("--squares", type=int, nargs=2, default=(7, 5), metavar=("X", "Y"))
    cam.add_argument("--square-m", type=float, default=0.04)
    cam.add_argument("--marker-m", type=float, default=0.03)
    cam.add_argument("--dictionary", default="DICT_5X5_100")
    lat = sub.add_parser("latency", help="command-to-motion delay, camera age, inference latency")
    lat.add_argument("--out", default=None,
                     help="default: OUTPUT_DIR/calibration/ROBOT/latency.yaml, which sessions on that robot read")
    lat.add_argument("--joint", type=int, default=0, help="index of the joint stepped")
    lat.add_argument("--step", type=float, default=4.0, help="step size (degrees)")
    lat.add_argument("--trials", type=int, default=4)
    lat.add_argument("--inference-runs", type=int, default=20)
    sub.add_parser("motors", help="LeRobot's motor calibration on the connected robot")
    return parser


def main(argv: list[str]) -> int:
    """``argv``: which calibration and its options (with dashes), and configuration overrides (key=value)."""
    options = [a for a in argv if "=" not in a or a.startswith("-")]
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    args = _parser().parse_args(options)
    if args.what == "camera":
        return _camera(args)
    if args.what == "latency":
        return _latency(args, overrides)
    return _motors(overrides)


def _camera(args) -> int:
    # OpenCV (the edge extra): the latency and motor calibrations run without it
    from robot_rl.calibration.camera import CalibrationError, CharucoBoardSpec, calibrate_camera, load_images

    paths = sorted({p for pattern in args.images for p in (glob.glob(pattern) or [pattern])})
    spec = CharucoBoardSpec(args.squares[0], args.squares[1], args.square_m, args.marker_m, args.dictionary)
    try:
        result = calibrate_camera(load_images(paths), spec)
    except CalibrationError as exc:
        print(f"robot-rl calibrate camera: {exc}", file=sys.stderr)
        return 2
    out = result.save_yaml(args.out)
    print(f"RMS reprojection error {result.reprojection_error_px:.3f} px over {result.views_used} views "
          f"({result.views_rejected} rejected); fx={result.K[0, 0]:.1f} fy={result.K[1, 1]:.1f} -> {out}")
    if result.reprojection_error_px > 1.0:
        print("warning: error above 1 px; retake blurry or glare-affected images", file=sys.stderr)
    return 0


def _latency(args, overrides: list[str]) -> int:
    cfg = load_config(overrides)
    # Inference is timed only for weights someone named (or a policy that has none): the
    # fallbacks of the sim jobs were not chosen for this robot (see session.runner.check_policy_choice).
    timed = not hasattr(cfg.policy, "path") or bool(cfg.policy.path)
    robot = ROBOTS.build(cfg.robot)
    robot.connect()
    try:
        policy = load_policy(cfg) if timed else None
        instruction = robot.reset(seed=0) if hasattr(robot, "reset") else cfg.session.instruction
        report = calibrate_latency(
            robot, WallClock(), policy, instruction,
            StepTestConfig(joint=args.joint, step=args.step, trials=args.trials), inference_runs=args.inference_runs,
        )
    except LatencyCalibrationError as exc:
        print(f"robot-rl calibrate latency: {exc}", file=sys.stderr)
        return 2
    finally:
        robot.disconnect()
    out = report.save_yaml(args.out or default_latency_path(cfg.output_dir, str(getattr(robot, "name", "robot"))))
    p90 = report.inference_ms.get("p90")
    inference = f"{p90:.1f} ms" if p90 is not None else "n/a (no policy.path)"
    print(f"command-to-motion {report.command_to_motion_ticks} ticks (trials {report.command_to_motion_trials}); "
          f"camera age {report.camera_frame_age_ms or 'n/a'}; inference p90 {inference}; "
          f"delay prior {report.delay_prior_ticks} ticks -> {out} "
          f"(sessions and edges on this robot read it; elsewhere: edge.latency_calibration={out})")
    return 0


def _motors(overrides: list[str]) -> int:
    cfg = load_config(overrides)
    if not isinstance(cfg.robot, LeRobotRobotConfig):
        print("robot-rl calibrate motors: only LeRobot robots have motor calibration here; "
              "pass robot=so101 (the sim needs none, a ROS 2 arm is calibrated by its driver)", file=sys.stderr)
        return 2
    # Cameras play no part in motor calibration; a missing one must not stop it.
    robot = ROBOTS.build(dataclasses.replace(cfg.robot, cameras={}))
    try:
        path = calibrate_motors(robot)
    except NoRobotError as exc:
        print(f"robot-rl calibrate motors: {exc}", file=sys.stderr)
        return 2
    print(f"calibration saved to {path}")
    return 0
