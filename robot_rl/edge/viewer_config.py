"""Where an edge node shows what it does, live: nowhere (``viewer=none``) or Rerun (``viewer=rerun``).

Kept apart from ``rerun_view`` so that reading the configuration imports no Rerun.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from robot_rl.core.registry import VIEWERS


class RerunMode(StrEnum):
    spawn = "spawn"  # start the Rerun viewer on this machine (it listens at ``url``) and log to it
    connect = "connect"  # log to a viewer already listening at ``url`` (another machine: its address)
    serve = "serve"  # serve the log at ``url``'s port and a web viewer at ``web_port`` (a headless robot PC)
    save = "save"  # write one ``.rrd`` file per robot under ``dir`` (open with ``rerun DIR/*.rrd``)


@VIEWERS.register("none", builder="robot_rl.edge.rerun_view:no_view")
@dataclass
class NoViewerConfig:
    """No live view (the default: a robot PC logs nothing it was not asked to)."""


@VIEWERS.register("rerun", builder="robot_rl.edge.rerun_view:RerunView")
@dataclass
class RerunViewerConfig:
    """Rerun, with LeRobot's entity names (``observation.images.<camera>``, ``observation.state``,
    ``action``) under one prefix per robot, plus the chunks the edge plans and executes."""

    mode: RerunMode = RerunMode.spawn
    url: str = "rerun+http://127.0.0.1:9876/proxy"  # spawn / connect / serve: the viewer's gRPC address
    web_port: int = 9090  # serve: the web viewer's port (http://HOST:9090)
    dir: str = "${output_dir}/rerun"  # save: one ROBOT_ID.rrd per robot (link.robot_id, else the robot's name)
    # Robots logging under the same recording id appear as one recording (``robot-rl run`` gives its
    # robots the run's); "" = a recording of its own per robot.
    recording: str = ""
    # Steps and chunks wait here for the logging thread; past it new ones are dropped and counted,
    # because the control thread never waits for a viewer.
    queue_size: int = 512
    compress_images: bool = True  # JPEG in the log: ~10x less memory in the viewer for camera frames
    memory_limit: str = "25%"  # spawn: the viewer drops its oldest data beyond this share of RAM

    def __post_init__(self) -> None:
        self.mode = RerunMode(self.mode)
        if self.queue_size < 1:
            raise ValueError(f"viewer.queue_size must be >= 1, got {self.queue_size}")

    def for_robots(self, recording: str) -> RerunViewerConfig:
        """What the robots of one run log with, in one recording, once the viewer or the server is up
        (``rerun_view.start_viewer``): they connect to its address (a saved log stays a file per robot)."""
        mode = self.mode if self.mode in (RerunMode.save, RerunMode.connect) else RerunMode.connect
        return replace(self, mode=mode, recording=self.recording or recording)
