"""Scripted-expert demonstrations in the sim, recorded as LeRobotDataset v3.

Demonstrations are the starting data of every run: behaviour cloning learns from
them, and the learner keeps them as a separate sampling stream (RLPD-style mixing).
Only successful attempts are stored, because a failed demonstration teaches failure.
Choosing the attempts (``expert_attempts``) and writing them (``store_demos``) are separate so
that the sim can run in a process of its own while this one writes (``robot_rl.app.demo_process``);
``robot_rl.app.record_demos`` picks one way or the other from the configuration.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from robot_rl.app.config import Seeds
from robot_rl.core.layout import RecordedLayout
from robot_rl.core.types import Episode, Step
from robot_rl.data.recorder import EpisodeRecorder

ARM_JOINTS = 5  # the SO-101's arm joints, before the gripper: DART's noise moves these only
# Ticks recorded after success so the policy also learns to settle instead of drifting.
SETTLE_TICKS = 5


@dataclass
class DemoSummary:
    attempted: int
    stored: int
    steps: int
    per_family: dict[str, tuple[int, int]]  # family -> (stored, attempted)


def expert_episode(robot, expert, seed: int, family: str | None, episode_id: int, noise_deg: float = 0.0) -> Episode:
    """One scripted-expert attempt: observation and the expert's command, every tick.

    With ``noise_deg`` > 0 (DART: Laskey et al., 2017) the command the arm executes while the expert
    travels between waypoints carries Gaussian noise of that many degrees on each arm joint, and the
    expert's own command is what is recorded: the arm drifts as a cloned policy's would, and the
    demonstration shows the way back. The expert plans each tick from the command executed, so
    one tick's noise is corrected the next; near the cube it works undisturbed (``moving_freely``).
    """
    instruction = robot.reset(seed=seed, family=family)
    expert.reset()
    noise = np.random.default_rng(seed) if noise_deg > 0 else None  # one stream per scene: reproducible
    episode = Episode(robot.name, episode_id, instruction, task_family=robot.task.family, seed=seed)
    settle_left = None
    for tick in range(robot.config.max_episode_steps):
        obs = robot.get_observation()
        command = expert.act()
        if noise is not None and expert.moving_freely():
            disturbed = command.copy()
            disturbed[:ARM_JOINTS] += noise.normal(0.0, noise_deg, ARM_JOINTS).astype(np.float32)
            robot.send_action(disturbed)
            recorded = command  # the label is the expert's command; the noise only moved the arm
        else:
            recorded = robot.send_action(command)
        success = robot.is_success()
        if success and settle_left is None:
            settle_left = SETTLE_TICKS
        done = settle_left == 0 or tick == robot.config.max_episode_steps - 1
        episode.steps.append(
            Step(
                tick=tick,
                time_s=tick / robot.fps,
                state=obs["state"],
                action=recorded,
                images=obs["images"],
                instruction=instruction,
                policy_action=recorded,
                reward=robot.reward(),
                success=success,
                done=done,
            )
        )
        if done:
            break
        if settle_left is not None:
            settle_left -= 1
    episode.success = any(s.success for s in episode.steps)
    return episode


def expert_attempts(
    robot, expert, families: Iterable[str], episodes_per_family: int, seed: int = 0, stride: int = Seeds.stride,
    noise_deg: float = 0.0,
) -> Iterator[tuple[str, Episode]]:
    """Scripted-expert attempts, family by family in seed order, until each family has
    ``episodes_per_family`` successes (at most three times as many tries): (family, episode).
    ``noise_deg``: see ``expert_episode``."""
    attempted = 0
    for f_index, family in enumerate(families):
        ok = tries = 0
        # Each family gets its own seed range so adding a family changes no other demo.
        episode_seed = seed + stride * f_index
        while ok < episodes_per_family and tries < 3 * episodes_per_family:
            episode = expert_episode(robot, expert, episode_seed, family, attempted, noise_deg)
            episode_seed += 1
            tries += 1
            attempted += 1
            ok += int(episode.success)
            yield family, episode


def store_demos(
    attempts: Iterable[tuple[str, Episode]],
    layout: RecordedLayout,
    out_dir: str | Path,
    families: Iterable[str],
    episodes_per_family: int,
    progress: bool = True,
) -> DemoSummary:
    """Write the successful ``attempts`` into ``out_dir``; what was written stays finalized if
    ``attempts`` raises (a sim that fails half-way, Ctrl-C)."""
    families = list(families)
    # Demonstrations can be re-recorded after a crash, so finalize in batches (resume costs seconds).
    recorder = EpisodeRecorder(out_dir, layout.fps, layout.joint_names, layout.camera_shapes, finalize_every=25)
    counts = {family: [0, 0] for family in families}  # family -> [stored, attempted]
    stored = steps = 0
    bar = tqdm(total=episodes_per_family * len(families), desc="recording demos", disable=not progress)
    try:
        for family, episode in attempts:
            counts[family][1] += 1
            if episode.success:
                recorder.write_episode(episode)
                counts[family][0] += 1
                stored += 1
                steps += episode.num_steps
                bar.update(1)
    finally:
        recorder.close()
        bar.close()
    return DemoSummary(
        attempted=sum(tries for _, tries in counts.values()), stored=stored, steps=steps,
        per_family={family: (ok, tries) for family, (ok, tries) in counts.items()},
    )
