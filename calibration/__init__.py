"""Calibration: camera intrinsics (ChArUco, camera.py), latency for the edge's roll-forward
(latency.py), and motor calibration through LeRobot (motors.py). Run them with
``robot-rl calibrate camera|latency|motors``."""
