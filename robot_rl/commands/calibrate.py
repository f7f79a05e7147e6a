"""`robot-rl calibrate`: camera intrinsics, latency, motors.

    robot-rl calibrate camera --images 'shots/*.png' --out calib/front.yaml [--squares 7 5 ...]
    robot-rl calibrate latency robot=so101 policy.path=outputs/bc_policy --out calib/latency.yaml
    robot-rl calibrate motors robot=so101 robot.port=/dev/ttyACM0

Options with dashes belong to the calibration; ``key=value`` arguments are Hydra overrides
selecting the robot and policy, as for ``robot-rl session``.
"""

from __future__ import annotations

import argparse
import glob
import logging
import sys

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
    lat.add_argument("--out", default="outputs/calibration/latency.yaml")
    lat.add_argument("--joint", type=int, default=0, help="index of the joint stepped")
    lat.add_argument("--step", type=float, default=4.0, help="step size (degrees)")
    lat.add_argument("--trials", type=int, default=4)
    lat.add_argument("--inference-runs", type=int, default=20)
    sub.add_parser("motors", help="LeRobot's motor calibration on the connected robot")
    return parser


def main(argv: list[str]) -> int:
    options = [a for a in argv if "=" not in a or a.startswith("-")]
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    args = _parser().parse_args(options)
    if args.what == "camera":
        return _camera(args)
    if args.what == "latency":
        return _latency(args, overrides)
    return _motors(overrides)


def _camera(args) -> int:
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
    from robot_rl.calibration.latency import LatencyCalibrationError, StepTestConfig, calibrate_latency
    from robot_rl.commands.session import compose
    from robot_rl.core.clock import WallClock
    from robot_rl.session import factory

    cfg = compose(overrides)
    robot = factory.make_robot(cfg)
    robot.connect()
    try:
        policy = None
        if cfg.get("policy") is not None and (cfg.policy.get("path") or cfg.policy.get("type") == "hold"):
            policy = factory.make_policy(cfg, len(robot.joint_names))
        instruction = robot.reset(seed=0) if hasattr(robot, "reset") else str(cfg.get("session", {}).get("instruction", ""))
        report = calibrate_latency(
            robot, WallClock(), policy, instruction,
            StepTestConfig(joint=args.joint, step=args.step, trials=args.trials), inference_runs=args.inference_runs,
        )
    except LatencyCalibrationError as exc:
        print(f"robot-rl calibrate latency: {exc}", file=sys.stderr)
        return 2
    finally:
        robot.disconnect()
    out = report.save_yaml(args.out)
    inference = report.inference_ms.get("p90")
    print(f"command-to-motion {report.command_to_motion_ticks} ticks (trials {report.command_to_motion_trials}); "
          f"camera age {report.camera_frame_age_ms or 'n/a'}; inference p90 "
          f"{'%.1f ms' % inference if inference is not None else 'n/a (no policy.path)'}; "
          f"delay prior {report.delay_prior_ticks} ticks -> {out} (use edge.delay_prior_ticks={report.delay_prior_ticks})")
    return 0


def _motors(overrides: list[str]) -> int:
    from robot_rl.calibration.motors import NoRobotError, calibrate_motors
    from robot_rl.commands.session import compose
    from robot_rl.session import factory

    cfg = compose(overrides)
    if factory.robot_backend(cfg) != "lerobot":
        print("robot-rl calibrate motors: only LeRobot robots have motor calibration here; "
              "pass robot=so101 (the sim needs none, a ROS 2 arm is calibrated by its driver)", file=sys.stderr)
        return 2
    cfg.robot.cameras = {}  # cameras play no part in motor calibration; a missing one must not stop it
    robot = factory.make_robot(cfg)
    try:
        path = calibrate_motors(robot)
    except NoRobotError as exc:
        print(f"robot-rl calibrate motors: {exc}", file=sys.stderr)
        return 2
    print(f"calibration saved to {path}")
    return 0
