"""Test-wide settings: offline hub, headless rendering, loopback-only ROS 2."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
