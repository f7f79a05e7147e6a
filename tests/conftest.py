"""Test-wide settings: offline hub, headless rendering, loopback-only ROS 2."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config, items):
    """Slow files first (stable otherwise): ``make test`` runs files on two workers (pytest-xdist,
    ``--dist loadfile``), and a long end-to-end file that starts last would run alone at the end."""
    def order(item) -> tuple[bool, int]:
        slow = item.get_closest_marker("slow")
        return slow is None, slow.kwargs.get("order", 1) if slow is not None else 1

    items.sort(key=order)  # slow(order=0): the longest, started before the other slow files
