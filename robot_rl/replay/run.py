"""One replay run: map a logged dataset onto the sim, replay each episode, write the outputs.

Per episode it re-creates the start (``scenes``), replays the actions open-loop
(``open_loop``) while writing the side-by-side MP4 (``video``), optionally asks a
policy what it would have done (``counterfactual``), and plots both (``report``).
The run ends with one JSON summary; this module only wires those pieces together.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from robot_rl.core.errors import ConfigError
from robot_rl.replay.config import ReplayConfig
from robot_rl.replay.counterfactual import CounterfactualResult, counterfactual_replay
from robot_rl.replay.dataset import LoggedDataset, LoggedEpisode
from robot_rl.replay.joint_mapping import JointMapper, JointMapping, build_mapper, map_camera
from robot_rl.replay.open_loop import FrameSink, TrackingResult, replay_open_loop
from robot_rl.replay.report import plot_episode, write_json
from robot_rl.replay.rerun_log import ReplayView, open_replay_view
from robot_rl.replay.scenes import Scene
from robot_rl.replay.video import ReplayVideoWriter

log = logging.getLogger(__name__)


@dataclass
class MappedEpisode:
    """A logged episode in sim units and sim camera names (what the sim and policies consume)."""

    logged: LoggedEpisode
    states: np.ndarray
    actions: np.ndarray
    images: dict[str, np.ndarray]  # sim/policy camera name -> frames

    @property
    def index(self) -> int:
        return self.logged.index


@dataclass
class EpisodeReplay:
    index: int
    instruction: str
    tracking: TrackingResult
    counterfactual: CounterfactualResult | None = None
    video: Path | None = None
    plot: Path | None = None

    def as_dict(self) -> dict:
        return {
            "episode": self.index,
            "instruction": self.instruction,
            "tracking": self.tracking.as_dict(),
            "counterfactual": self.counterfactual.as_dict() if self.counterfactual else None,
            "video": str(self.video) if self.video else None,
            "plot": str(self.plot) if self.plot else None,
        }


@dataclass
class ReplayRun:
    source: str
    fps: int
    episodes: list[EpisodeReplay]
    summary_path: Path


class EpisodeMapper:
    """Converts logged episodes of one dataset into sim units (built once per dataset)."""

    def __init__(self, dataset: LoggedDataset, sim_joints: tuple[str, ...], mapping: JointMapping) -> None:
        self.mapping = mapping
        self.state: JointMapper = build_mapper(mapping, dataset.state_names, sim_joints)
        self.action: JointMapper = build_mapper(mapping, dataset.action_names, sim_joints)

    def __call__(self, logged: LoggedEpisode) -> MappedEpisode:
        images = {map_camera(cam, self.mapping): frames for cam, frames in logged.images.items()}
        return MappedEpisode(logged, self.state.to_sim(logged.state), self.action.to_sim(logged.action), images)


def replay_dataset(robot, dataset: LoggedDataset, config: ReplayConfig, policy=None,
                   progress: bool = True, viewer: Any = None) -> ReplayRun:
    """Replay every loaded episode of ``dataset`` in ``robot`` (a SimSO101); ``policy`` enables counterfactuals;
    ``viewer`` (``viewer=rerun``) logs logged and simulated cameras and joints to Rerun."""
    if config.counterfactual and policy is None:
        raise ValueError("counterfactual replay needs a policy (policy.path=CHECKPOINT)")
    if config.seeds is not None and len(config.seeds) != len(dataset.episodes):
        raise ConfigError(
            f"replay.seeds has {len(config.seeds)} seeds for {len(dataset.episodes)} episodes; give one per episode"
        )
    to_sim = EpisodeMapper(dataset, tuple(robot.joint_names), config.mapping)
    out_dir = Path(config.out_dir)
    rerun = open_replay_view(viewer, tuple(robot.joint_names))
    results = []
    try:
        for k, logged in enumerate(dataset.episodes):
            episode = to_sim(logged)
            seed = logged.seed if logged.seed is not None else (config.seeds[k] if config.seeds else None)
            results.append(replay_episode(robot, episode, seed, dataset.fps, config, out_dir, policy, rerun,
                                          progress))
    finally:
        if rerun is not None:
            rerun.close()
    summary = write_json(out_dir / "replay.json", {
        "dataset": dataset.source,
        "fps": dataset.fps,
        "mapping_is_identity": to_sim.state.is_identity and to_sim.action.is_identity,
        "episodes": [r.as_dict() for r in results],
    })
    return ReplayRun(dataset.source, dataset.fps, results, summary)


def replay_episode(
    robot,
    episode: MappedEpisode,
    seed: int | None,
    fps: int,
    config: ReplayConfig,
    out_dir: Path,
    policy=None,
    rerun: ReplayView | None = None,
    progress: bool = True,
) -> EpisodeReplay:
    """Open-loop replay (with video), then the optional counterfactual pass and the plot."""
    logged = episode.logged
    scene = Scene(seed=seed, instruction=logged.instruction, initial_state=episode.states[0])
    video = None
    writer = None
    if config.video:
        video = out_dir / f"episode_{episode.index:03d}.mp4"
        writer = ReplayVideoWriter(video, fps, logged.interventions(), logged.versions(),
                                   list(logged.images), list(robot.camera_names))
    sink = _frame_sink(robot, episode, writer, rerun)
    try:
        tracking = replay_open_loop(robot, episode.states, episode.actions, scene, realtime=config.realtime,
                                    frame_sink=sink, fallback_seed=config.fallback_seed, progress=progress)
    finally:
        if writer is not None:
            writer.close()
    counterfactual = None
    if config.counterfactual:
        counterfactual = counterfactual_replay(policy, episode.images, episode.states, episode.actions,
                                               logged.instruction, logged.interventions(),
                                               batch_size=config.batch_size, progress=progress)
    plot = None
    if config.plots:
        plot = plot_episode(out_dir / f"episode_{episode.index:03d}.png",
                            f"episode {episode.index}: {logged.instruction}", fps, tracking, counterfactual,
                            logged.interventions())
    return EpisodeReplay(episode.index, logged.instruction, tracking, counterfactual, video, plot)


def _frame_sink(robot, episode: MappedEpisode, writer: ReplayVideoWriter | None, rerun: ReplayView | None
                ) -> FrameSink | None:
    """Per step: compose the video frame and/or log to Rerun; None when neither is wanted (no rendering)."""
    if writer is None and rerun is None:
        return None
    logged = episode.logged

    def sink(t: int, sim_images: dict[str, np.ndarray]) -> None:
        logged_images = {cam: frames[t] for cam, frames in logged.images.items()}
        if writer is not None:
            writer.write(t, list(logged_images.values()), [sim_images[c] for c in robot.camera_names])
        if rerun is not None:
            rerun.step(episode.index, t, logged_images, sim_images, episode.states[t], robot.joint_state())

    return sink
