"""In-memory sampling index over the replay store: online, intervention and demonstration streams.

Why in memory: the trainer draws thousands of random (episode, t) samples per second
with state-offset augmentation, which indexes across time inside an episode; reading
frames back from parquet for that would starve the GPU.

Why canonical order: entries are kept sorted by their key (robot, episode, fragment),
and a sample is located through per-stream cumulative counts, so the index is a pure
function of its content. An index rebuilt from disk after a restart therefore samples
exactly like the one that was checkpointed, whatever order the data arrived in.

Streams: every step of a demonstration entry is a demonstration step; robot steps go
to ``intervention`` when a human was driving and to ``online`` otherwise, except the ticks
where the runtime only held the arm (``held``: no chunk had arrived), which are nobody's
decision and are never a training target (``build_sample`` also cuts chunks there).

Frames: the index keeps each camera's frames at the size the policy reads (``InputFrames``,
resized once as they arrive), not at the camera's: a 640x480 pair of cameras is 1.8 MB a step, the
64x64 frames FlowVLA reads 25 kB. Under ``memory_budget`` bytes of frames, finished episodes let
their frames go, oldest first: to the frame spill (``robot_rl.learner.frame_spill``: the same bytes
on local disk, read back without decoding) while it has room, else, once the dataset holds the
episode (``mark_stored``), to the dataset, read back and decoded by ``robot_rl.learner.stored_frames``
on worker processes. Every step stays sampleable with the same stream mixing. A batch is drawn in
two parts: ``plan`` (which steps, their numbers and which frames, under the lock, a function of the
content and the generator only) and ``fill`` (the frames, from memory, the spill or the dataset), so
where an episode's frames are never changes what is sampled.

Learning signal: each sample also carries the reward fields of
``robot_rl.learner.rewards.transition_fields`` (return, chunk reward and discount, next
observation, episode outcome, policy version), computed from the episode as it stands.
An entry's ``done`` column says whether its episode has ended: online episodes are
sampled while still growing, and their outcome (hence their return) is unknown until then.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import torch

from robot_rl.core.types import EpisodeVerdict, Step, source_code
from robot_rl.learner.config import RewardConfig
from robot_rl.learner.frame_spill import FrameSpill, SpilledFrames, read_all_spilled, read_spilled
from robot_rl.learner.rewards import TASK_CODE, EpisodeRewards, episode_rewards, transition_fields
from robot_rl.learner.stored_frames import FrameReader, StoredEpisode, UnreadableFramesError
from robot_rl.learner.streams import STREAMS
from robot_rl.policies.augment import build_sample, sample_offsets
from robot_rl.policies.base import ObservationHistory
from robot_rl.policies.trainable import InputFrames

log = logging.getLogger(__name__)

EntryKey = tuple[str, int, int]  # (robot_id, episode_id, fragment); demonstrations use robot_id "~demo"
DEMO_ROBOT = "~demo"
IMAGES = "images."
# A sample's frames: its step's, the next chunk's, and those of the ticks before (observation history).
FRAME_FIELDS = (IMAGES, f"next.{IMAGES}", f"past.{IMAGES}")


class GrowingEpisode:
    """One episode's arrays, appended segment by segment (amortised O(1) growth by doubling)."""

    def __init__(self, instruction: str, is_demonstration: bool) -> None:
        self.instruction = instruction
        self.is_demonstration = is_demonstration
        self.length = 0
        self._arrays: dict[str, np.ndarray] = {}

    def append(self, columns: Mapping[str, np.ndarray]) -> None:
        n = len(next(iter(columns.values())))
        for name, values in columns.items():
            values = np.asarray(values)
            if len(values) != n:
                raise ValueError(f"column {name!r} has {len(values)} rows, expected {n}")
            buf = self._arrays.get(name)
            if buf is None:
                buf = np.empty((max(16, n), *values.shape[1:]), dtype=values.dtype)
            elif self.length + n > len(buf):
                bigger = np.empty((max(2 * len(buf), self.length + n), *buf.shape[1:]), dtype=buf.dtype)
                bigger[: self.length] = buf[: self.length]
                buf = bigger
            buf[self.length : self.length + n] = values
            self._arrays[name] = buf
        self.length += n

    def compact(self) -> None:
        """Cut the buffers of its numbers to the rows held. A finished episode takes no more steps, and the
        spare rows that growth by doubling left (up to half of each buffer) would stay for as long as the
        learner runs: with thousands of episodes, memory that grows with the fleet's hours. Its frames
        are left as they are: the budget counts their buffers, they leave for the spill whole, and a copy
        of camera-size frames under the index's lock would hold up the trainer's next batch."""
        self._arrays = {name: buf[: self.length].copy() if len(buf) > self.length and not name.startswith(IMAGES)
                        else buf for name, buf in self._arrays.items()}

    def frame_bytes(self) -> int:
        """Bytes of camera frames this entry holds in memory (its buffers, grown ahead of its length)."""
        return sum(buf.nbytes for name, buf in self._arrays.items() if name.startswith(IMAGES))

    def frame_columns(self) -> dict[str, np.ndarray]:
        """``images.<cam>`` -> its frames held in memory (views of the buffers, up to the length)."""
        return {name: buf[: self.length] for name, buf in self._arrays.items() if name.startswith(IMAGES)}

    @property
    def finished(self) -> bool:
        """The last step held is terminal: no more steps of this entry will arrive."""
        done = self._arrays.get("done")
        return self.is_demonstration or (done is not None and self.length > 0 and bool(done[self.length - 1]))

    def drop_frames(self) -> None:
        """Let the camera frames go (the dataset holds them); every other column stays."""
        self._arrays = {name: buf for name, buf in self._arrays.items() if not name.startswith(IMAGES)}

    def restore_frames(self, frames: Mapping[str, np.ndarray]) -> None:
        """Hold ``images.<cam>`` -> frames [length, ...] again (they were let go), to take more steps."""
        self._arrays.update(frames)

    def frames(self, name: str) -> np.ndarray | None:
        """The ``images.<cam>`` frames held in memory, or None once they were let go."""
        buf = self._arrays.get(name)
        return None if buf is None else buf[: self.length]

    def mark_finished(self) -> None:
        """The episode will receive no more steps (e.g. cut short): its last step becomes terminal."""
        if self.length and "done" in self._arrays:
            self._arrays["done"][self.length - 1] = True

    def set_verdict(self, verdict: EpisodeVerdict) -> None:
        """The episode's outcome, as judged after its last step arrived: put on that step."""
        if not self.length:
            return
        last = self.length - 1
        for name, value in (("success", verdict.success), ("success_source", source_code(verdict.source)),
                            ("success_confidence", verdict.confidence)):
            if name in self._arrays:
                self._arrays[name][last] = value

    def view(self) -> dict:
        """The episode dict ``build_sample`` reads (views, no copies)."""
        out: dict = {name: buf[: self.length] for name, buf in self._arrays.items()}
        out["instruction"] = self.instruction
        return out

    def held_count(self) -> int:
        """Ticks of this robot episode where the runtime held the arm (never sampled)."""
        held = self._arrays.get("held")
        return 0 if held is None or self.is_demonstration else int(held[: self.length].sum())

    def stream_positions(self, stream: str) -> np.ndarray:
        """This entry's steps in ``stream`` (int32: an episode is far shorter than 2**31 steps, and the
        index keeps these for every step it holds)."""
        positions: np.ndarray
        if self.is_demonstration:
            positions = np.arange(self.length) if stream == "demonstration" else np.empty(0, dtype=np.int64)
        else:
            flags = self._arrays["is_intervention"][: self.length]
            if stream == "intervention":
                positions = np.flatnonzero(flags)
            elif stream == "online":
                held = self._arrays.get("held")
                positions = np.flatnonzero(~flags if held is None else ~flags & ~held[: self.length])
            else:
                positions = np.empty(0, dtype=np.int64)
        return positions.astype(np.int32)


def held_steps(is_intervention: np.ndarray, chunk_id: np.ndarray) -> np.ndarray:
    """Robot ticks where the runtime held the arm: nobody drove (no human, no chunk)."""
    return ~np.asarray(is_intervention, dtype=bool) & (np.asarray(chunk_id) < 0)


def steps_to_columns(steps: Sequence[Step], cameras: Sequence[str]) -> dict[str, np.ndarray]:
    """Steps -> the column arrays the index keeps (state, action, images, flags, reward, done, held)."""
    columns = {
        "state": np.stack([np.asarray(s.state, dtype=np.float32) for s in steps]),
        "action": np.stack([np.asarray(s.action, dtype=np.float32) for s in steps]),
        "is_intervention": np.array([s.is_intervention for s in steps], dtype=bool),
        "reward": np.array([s.reward for s in steps], dtype=np.float32),
        "success": np.array([s.success for s in steps], dtype=bool),
        "done": np.array([s.done for s in steps], dtype=bool),
        "policy_version": np.array([s.policy_version for s in steps], dtype=np.int32),
        "success_source": np.array([source_code(s.success_source) for s in steps], dtype=np.int8),
        "success_confidence": np.array([s.success_confidence for s in steps], dtype=np.float32),
    }
    columns["held"] = held_steps(columns["is_intervention"], np.array([s.chunk_id for s in steps]))
    for cam in cameras:
        columns[f"images.{cam}"] = np.stack([s.images[cam] for s in steps])
    return columns


def dataset_episode_to_columns(episode: Mapping, cameras: Sequence[str], *,
                               robot_episode: bool = True) -> dict[str, np.ndarray]:
    """An episode dict from ``load_episode_arrays`` -> the same columns as ``steps_to_columns``.

    A dataset episode is complete (committed, or a recorded demonstration), so its last
    step is terminal even if it was cut short: no more steps of it will ever arrive.
    ``robot_episode=False`` for demonstrations: they hold no chunks, and none of their
    steps is a runtime hold.
    """
    n = len(episode["action"])

    def flat(key: str, dtype: type, default: float | bool | int) -> np.ndarray:
        value = episode.get(key)
        return np.full(n, default, dtype=dtype) if value is None else np.asarray(value, dtype=dtype).reshape(n)

    columns = {
        "state": np.asarray(episode["state"], dtype=np.float32),
        "action": np.asarray(episode["action"], dtype=np.float32),
        "is_intervention": flat("is_intervention", bool, False),
        "reward": flat("next.reward", np.float32, 0.0),
        "success": flat("next.success", bool, False),
        "policy_version": flat("policy_version", np.int32, -1),
        "done": flat("next.done", bool, False),
        "success_source": flat("next.success_source", np.int8, TASK_CODE),  # older datasets: the task's
        "success_confidence": flat("next.success_confidence", np.float32, 1.0),
    }
    if n:
        columns["done"][-1] = True
    chunk_id = episode.get("chunk_id")
    if robot_episode and chunk_id is not None:
        columns["held"] = held_steps(columns["is_intervention"], np.asarray(chunk_id).reshape(n))
    else:
        columns["held"] = np.zeros(n, dtype=bool)
    for cam in cameras:
        columns[f"images.{cam}"] = np.asarray(episode[f"images.{cam}"], dtype=np.uint8)
    return columns


def fit_step_frames(steps: Sequence[Step], cameras: Sequence[str], fits: Mapping[str, InputFrames]) -> list[Step]:
    """The steps holding only ``cameras``' frames, each at the size ``fits`` gives: what a decoded segment
    keeps while it waits for the index (a queue of camera-size frames would hold 1.8 MB a step)."""
    kept = {cam: np.stack([s.images[cam] for s in steps]) for cam in cameras} if steps else {}
    kept = {cam: fits[cam].apply(frames) if cam in fits else frames for cam, frames in kept.items()}
    return [dataclasses.replace(s, images={cam: kept[cam][i] for cam in cameras}) for i, s in enumerate(steps)]


def fit_frames(columns: Mapping[str, np.ndarray], fits: Mapping[str, InputFrames]) -> dict[str, np.ndarray]:
    """Columns with every ``images.<cam>`` at the size ``fits`` gives for that camera."""
    return {name: fits[name[len(IMAGES):]].apply(values) if name.startswith(IMAGES) and name[len(IMAGES):] in fits
            else values for name, values in columns.items()}


@dataclass(frozen=True)
class SampleSpec:
    """What a batch needs: chunking, cameras, augmentation (the policy's config) and rewards (the trainer's)."""

    chunk_size: int
    cameras: tuple[str, ...]
    max_state_offset: int = 0
    offset_weights: tuple[float, ...] | None = None
    rewards: RewardConfig = field(default_factory=RewardConfig)
    history: ObservationHistory = field(default_factory=ObservationHistory)  # the policy's past observations


@dataclass
class FrameSlot:
    """One frame a planned sample needs: ``samples[sample][field]`` (its item ``position`` for the frames of
    the ticks before) is frame ``number`` of ``camera``."""

    sample: int
    field: str
    camera: str
    number: int
    frames: np.ndarray | None  # the entry's frames in memory, or None: read from ``spilled`` or ``stored``
    spilled: SpilledFrames | None
    stored: StoredEpisode | None
    position: int | None = None


class BatchPlan:
    """A batch drawn but not yet filled with its frames (``SamplingIndex.plan`` / ``fill``)."""

    def __init__(self, streams: np.ndarray) -> None:
        self.streams = streams
        self.samples: list[dict] = []
        self.frame_slots: list[FrameSlot] = []
        self.instructions: list[str] = []
        self.rewards: list[float] = []
        self.flags: list[bool] = []

    def add(self, sample: dict, frames: Mapping[str, np.ndarray | None], spilled: Mapping[str, SpilledFrames] | None,
            stored: StoredEpisode | None, instruction: str, reward: float, is_intervention: bool) -> None:
        i = len(self.samples)
        for name in [k for k in sample if k.startswith(FRAME_FIELDS)]:
            camera = name.split(IMAGES, 1)[1]
            where = None if spilled is None else spilled[f"{IMAGES}{camera}"]
            numbers = np.asarray(sample[name])
            if numbers.ndim == 0:
                self.frame_slots.append(FrameSlot(i, name, camera, int(numbers), frames[camera], where, stored))
                continue
            sample[name] = [None] * len(numbers)  # filled frame by frame; a batch stacks them [B, steps - 1, ...]
            self.frame_slots.extend(FrameSlot(i, name, camera, int(number), frames[camera], where, stored, position)
                                    for position, number in enumerate(numbers))
        self.samples.append(sample)
        self.instructions.append(instruction)
        self.rewards.append(reward)
        self.flags.append(is_intervention)


def _entry_key(key: Hashable) -> EntryKey:
    """A key the spill hands back: the entry key it was given."""
    return cast(EntryKey, key)


class SpillFileDroppedError(Exception):
    """A spill file a planned batch reads from was dropped since (its episodes are in the dataset)."""


class SamplingIndex:
    """Thread-safe index: the store appends, the trainer samples.

    A restarted store reads its dataset into the index in the background (``loading`` ... ``loaded``),
    so robots are served at once however big the store. Until then the index takes appends and counts
    what it holds, but whatever depends on all of it waits: a batch (drawn from all stored data), a
    fresh policy's normalisation statistics, and the manifest a checkpoint records.
    """

    def __init__(self, cameras: Sequence[str], input_frames: Mapping[str, InputFrames] | None = None, *,
                 memory_budget: int | None = None, reader: FrameReader | None = None,
                 spill: FrameSpill | None = None) -> None:
        """``input_frames``: the size the policy reads per camera (frames are kept at it); ``memory_budget``:
        bytes of frames kept in memory (None: all), the rest written to ``spill`` (None: none) while it has
        room, else read back from the dataset by ``reader`` when sampled."""
        if memory_budget is not None and reader is None:
            raise ValueError("SamplingIndex: a memory budget needs a reader for the frames it lets go")
        self.cameras = tuple(cameras)
        self.input_frames = dict(input_frames or {})
        self.memory_budget = memory_budget
        self.reader = reader
        self.spill = spill
        self._frame_bytes = 0
        # Entries whose frames are in memory and may leave it (finished, or in the dataset), oldest first.
        self._leavable: OrderedDict[EntryKey, None] = OrderedDict()
        self._dataset: dict[EntryKey, StoredEpisode] = {}  # every entry the dataset holds, wherever its frames are
        self._spilled: dict[EntryKey, dict[str, SpilledFrames]] = {}  # frames let go to the spill
        self._on_disk: dict[EntryKey, StoredEpisode] = {}  # frames let go: read back from the dataset
        self._lock = threading.Lock()
        self._complete = threading.Event()
        self._complete.set()
        self._load_error: str | None = None
        self._keys: list[EntryKey] = []  # sorted
        self._entries: dict[EntryKey, GrowingEpisode] = {}
        self._positions: dict[tuple[EntryKey, str], np.ndarray] = {}
        self._cumulative: dict[str, np.ndarray] | None = None
        self._stream_keys: dict[str, list[EntryKey]] = {}
        # Per entry: (length, reward config, rewards) of the last computation; recomputed when either changes.
        self._rewards: dict[EntryKey, tuple[int, RewardConfig, EpisodeRewards]] = {}
        self.quarantined: list[EntryKey] = []  # entries left out because their stored frames do not decode

    # ------------------------------------------------------------ loading

    def loading(self) -> None:
        """Stored data is being read in: batches, statistics and the manifest wait for ``loaded``."""
        self._complete.clear()

    def loaded(self, error: str | None = None) -> None:
        """Every stored episode is in; ``error``: the read failed, and batches say so instead of waiting."""
        self._load_error = error
        self._complete.set()

    def wait_loaded(self, timeout_s: float | None = None) -> bool:
        return self._complete.wait(timeout_s)

    def _whole(self) -> None:
        """Wait until the index holds all stored data (or raise why it never will)."""
        self._complete.wait()
        if self._load_error is not None:
            raise RuntimeError(f"the sampling index could not read the stored dataset ({self._load_error}); "
                               "fix or move the store and restart the learner")

    # ------------------------------------------------------------ writing

    def append(self, key: EntryKey, columns: Mapping[str, np.ndarray], instruction: str) -> None:
        """Add steps to entry ``key`` (created on first use)."""
        columns = fit_frames(columns, self.input_frames)  # outside the lock: resizing takes time
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = GrowingEpisode(instruction, is_demonstration=key[0] == DEMO_ROBOT)
                self._entries[key] = entry
                bisect.insort(self._keys, key)
            if key in self._spilled:
                self._unspill_locked(key, entry)  # more of an episode closed early (re-sent segments)
            elif key in self._on_disk:
                raise ValueError(f"entry {key} is in the dataset and its frames left memory: it takes no more steps")
            before = entry.frame_bytes()
            entry.append(columns)
            if entry.finished:
                entry.compact()
            self._frame_bytes += entry.frame_bytes() - before
            for stream in STREAMS:
                self._positions[(key, stream)] = entry.stream_positions(stream)
            self._cumulative = None
            if entry.finished:
                self._leavable[key] = None
            self._evict_locked()  # an open episode's growth, too, may take finished ones' frames past the budget

    def mark_finished(self, key: EntryKey) -> None:
        """Entry ``key`` ends here (its episode was cut short): its outcome and returns become final."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                entry.mark_finished()
                entry.compact()
                self._rewards.pop(key, None)
                if key not in self._spilled and key not in self._on_disk:
                    self._leavable[key] = None
                    self._evict_locked()

    def set_verdict(self, key: EntryKey, verdict: EpisodeVerdict) -> None:
        """Entry ``key``'s outcome is ``verdict`` (the success detector's, on an episode nobody judged):
        its rewards and returns are computed anew."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                entry.set_verdict(verdict)
                self._rewards.pop(key, None)

    def mark_stored(self, key: EntryKey, episode: StoredEpisode) -> None:
        """Entry ``key`` is complete in the dataset as ``episode``: its frames may leave memory from now on
        (to the spill, or read back from the dataset), the oldest such entry's first, whenever the frames
        held pass the memory budget."""
        with self._lock:
            if key not in self._entries:
                return
            self._dataset[key] = episode
            if key not in self._spilled and key not in self._on_disk:
                self._leavable[key] = None
            self._evict_locked()
            readers_due = self.memory_budget is not None and (
                self._frame_bytes > self.memory_budget / 2 if self.spill is None
                else self.spill.failed is not None or self.spill.bytes > self.spill.max_bytes / 2)
        if readers_due and self.reader is not None:
            self.reader.start()  # its workers are up before the first batch that reads back from the dataset

    def _evict_locked(self) -> None:
        """Past the budget, let the oldest leavable entries' frames go: to the spill while it has room (or
        can make room by dropping episodes the dataset holds), else to the dataset once it holds them.
        An entry that can go to neither yet (finished, not yet written, the spill full) waits its turn."""
        if self.memory_budget is None or self._frame_bytes <= self.memory_budget:
            return
        for key in list(self._leavable):
            if self._frame_bytes <= self.memory_budget:
                return
            if self._spill_locked(key) or self._leave_to_dataset_locked(key):
                del self._leavable[key]

    def _spill_locked(self, key: EntryKey) -> bool:
        if self.spill is None:
            return False
        entry = self._entries[key]
        frames = entry.frame_columns()
        if not frames:
            return False
        nbytes = sum(f.nbytes for f in frames.values())
        while not self.spill.has_room(nbytes):
            oldest = self.spill.oldest()
            if self.spill.failed is not None or oldest is None:
                return False
            path, written = oldest
            held = [k for k in map(_entry_key, written)  # those whose frames are there now
                    if k in self._spilled and next(iter(self._spilled[k].values())).path == path]
            if any(k not in self._dataset for k in held):
                return False  # only episodes the dataset holds may leave the spill
            self.spill.drop_oldest()
            for dropped in held:
                del self._spilled[dropped]
                self._on_disk[dropped] = self._dataset[dropped]
        where = self.spill.put(key, frames)
        if where is None:
            return False
        self._frame_bytes -= entry.frame_bytes()
        entry.drop_frames()
        self._spilled[key] = where
        return True

    def _unspill_locked(self, key: EntryKey, entry: GrowingEpisode) -> None:
        """Entry ``key``'s frames back from the spill into memory (it takes more steps): read whole, as
        the steps to come are appended to them. Its copy in the spill is dropped with its file."""
        frames = {name: read_all_spilled(where) for name, where in self._spilled.pop(key).items()}
        entry.restore_frames(frames)
        self._frame_bytes += entry.frame_bytes()

    def _leave_to_dataset_locked(self, key: EntryKey) -> bool:
        episode = self._dataset.get(key)
        if episode is None:
            return False
        entry = self._entries[key]
        self._frame_bytes -= entry.frame_bytes()
        entry.drop_frames()
        self._on_disk[key] = episode
        return True

    @property
    def frame_bytes(self) -> int:
        """Bytes of camera frames held in memory (what ``memory_budget`` bounds, with the open episodes).
        Read under the lock: between an append and the eviction it brings about the count is over the
        budget for a moment, and the store would hold robots back for nothing."""
        with self._lock:
            return self._frame_bytes

    @property
    def entries_on_disk(self) -> int:
        """Entries whose frames are read back from the dataset when sampled."""
        return len(self._on_disk)

    @property
    def entries_spilled(self) -> int:
        """Entries whose frames are read back from the spill when sampled."""
        return len(self._spilled)

    # ------------------------------------------------------------ reading

    def counts(self) -> dict[str, int]:
        """Steps per stream."""
        with self._lock:
            cumulative, _ = self._cumulative_locked()
            return {s: int(cumulative[s][-1]) if len(cumulative[s]) else 0 for s in STREAMS}

    def held_steps(self) -> int:
        """Robot ticks kept but never sampled, because the runtime only held the arm."""
        with self._lock:
            return sum(entry.held_count() for entry in self._entries.values())

    @property
    def num_entries(self) -> int:
        return len(self._keys)

    def manifest(self) -> list[list]:
        """[robot_id, episode_id, fragment, length] per entry, in index order: what a checkpoint records."""
        self._whole()
        with self._lock:
            return [[*key, self._entries[key].length] for key in self._keys]

    def sample(self, batch_size: int, ratios: Mapping[str, float], spec: SampleSpec,
               rng: np.random.Generator, keep: Callable[[str], bool] | None = None) -> dict:
        """A training batch (torch tensors, FlowVLA layout) mixing streams by ``ratios``.

        Ratios are renormalised over the streams that hold data, so an empty
        intervention stream early in a run does not shrink the batch. Extra keys:
        ``weight`` (1.0), ``stream`` (index into STREAMS), ``reward`` and ``is_intervention``
        at the sampled step, and the reward fields of ``transition_fields`` (under
        ``spec.rewards``), for algorithms that need them.

        A stored episode whose frames do not decode is quarantined (left out of sampling from then
        on, said in one line) and the batch drawn again without it. ``keep``: draw only from the entries
        whose instruction it keeps (a task family's share of a batch: ``robot_rl.learner.family_balance``).
        """
        missing: str | None = None  # a spill file the last draw found gone
        while True:
            state = rng.bit_generator.state
            plan = self.plan(batch_size, ratios, spec, rng, keep)
            try:
                return self.fill(plan)
            except UnreadableFramesError as exc:
                if not self._quarantine(exc):
                    raise
            except SpillFileDroppedError as exc:
                # A spill file was dropped between plan and fill: the same draw again finds those frames
                # in the dataset (only episodes it holds leave the spill), so the batch is unchanged. Gone
                # twice, it was not dropped by the index but deleted under it: drawing again would loop.
                if str(exc) == missing:
                    raise RuntimeError(f"the sampling index's frame spill lost a file it still reads from ({exc}); "
                                       "something deleted it under the running learner: restart the learner "
                                       "(the spill is rebuilt from the dataset)") from exc
                missing = str(exc)
                rng.bit_generator.state = state

    def _quarantine(self, exc: UnreadableFramesError) -> bool:
        """Leave the entries stored as ``exc.episode`` out of sampling; False if there were none."""
        with self._lock:
            keys = [key for key, stored in self._on_disk.items() if stored == exc.episode]
            for key in keys:
                del self._on_disk[key]
                del self._dataset[key]
                entry = self._entries.pop(key)
                self._frame_bytes -= entry.frame_bytes()
                self._keys.remove(key)
                self._rewards.pop(key, None)
                for stream in STREAMS:
                    self._positions.pop((key, stream), None)
            self._cumulative = None
            self.quarantined.extend(keys)
        for key in keys:
            log.error("training: %s; robot %s episode %d is quarantined: no batch samples it again", exc.cause,
                      key[0], key[1])
        return bool(keys)

    def plan(self, batch_size: int, ratios: Mapping[str, float], spec: SampleSpec,
             rng: np.random.Generator, keep: Callable[[str], bool] | None = None) -> BatchPlan:
        """Which steps a batch holds, with every column but the frames; each frame as (entry, camera,
        frame number) and, while the entry holds them, its frames in memory. ``fill`` completes it."""
        self._whole()
        with self._lock:
            if keep is None:
                cumulative, stream_keys = self._cumulative_locked()
            else:  # counted for this draw only: a filter's entries change as episodes arrive
                cumulative, stream_keys = self._cumulative_of_locked(
                    [k for k in self._keys if keep(self._entries[k].instruction)])
            totals = np.array([cumulative[s][-1] if len(cumulative[s]) else 0 for s in STREAMS], dtype=np.int64)
            weights = np.array([ratios.get(s, 0.0) if totals[i] > 0 else 0.0 for i, s in enumerate(STREAMS)])
            if weights.sum() <= 0:
                raise LookupError(f"no steps to sample from streams with a positive ratio (steps per stream: "
                                  f"{dict(zip(STREAMS, totals.tolist(), strict=True))}, ratios: {dict(ratios)})")
            streams = rng.choice(len(STREAMS), size=batch_size, p=weights / weights.sum())
            offsets = sample_offsets(rng, batch_size, spec.max_state_offset, spec.offset_weights)
            plan = BatchPlan(streams)
            for stream_index, offset in zip(streams, offsets, strict=True):
                stream = STREAMS[stream_index]
                pick = int(rng.integers(0, totals[stream_index]))
                slot = int(np.searchsorted(cumulative[stream], pick, side="right"))
                key = stream_keys[stream][slot]
                before = int(cumulative[stream][slot - 1]) if slot else 0
                t = int(self._positions[(key, stream)][pick - before])
                entry = self._entries[key]
                episode = entry.view()
                numbers = np.arange(entry.length)
                for cam in spec.cameras:  # the frame numbers stand in for the frames: fill() looks them up
                    episode[f"{IMAGES}{cam}"] = numbers
                sample = build_sample(episode, t, int(offset), spec.chunk_size, spec.cameras, spec.history)
                sample.update(transition_fields(episode, t, int(offset), spec.chunk_size, spec.cameras, spec.rewards,
                                                self._episode_rewards_locked(key, episode, spec.rewards)))
                frames = {cam: entry.frames(f"{IMAGES}{cam}") for cam in spec.cameras}
                plan.add(sample, frames, self._spilled.get(key), self._on_disk.get(key), entry.instruction,
                         float(episode["reward"][t]), bool(episode["is_intervention"][t]))
        return plan

    def fill(self, plan: BatchPlan) -> dict:
        """The batch of ``plan``: frames from memory, from the spill, or read back from the dataset
        (``reader``) for the entries that let theirs go. ``SpillFileDroppedError``: draw it again."""
        wanted: dict[StoredEpisode, dict[str, list[int]]] = {}
        spilled = [(slot.spilled, slot.number) for slot in plan.frame_slots
                   if slot.frames is None and slot.spilled is not None]
        for slot in plan.frame_slots:
            if slot.frames is None and slot.spilled is None:
                assert slot.stored is not None  # frames leave memory for the spill or, once stored, the dataset
                wanted.setdefault(slot.stored, {}).setdefault(slot.camera, []).append(slot.number)
        try:
            from_spill = iter(read_spilled(spilled) if spilled else [])
        except FileNotFoundError as exc:
            raise SpillFileDroppedError(str(exc)) from exc
        read = self.reader.read(wanted) if wanted and self.reader is not None else {}
        taken = {episode: {cam: 0 for cam in cams} for episode, cams in wanted.items()}
        for slot in plan.frame_slots:
            if slot.frames is not None:
                image = slot.frames[slot.number]
            elif slot.spilled is not None:
                image = next(from_spill)
            else:
                assert slot.stored is not None
                image = read[slot.stored][slot.camera][taken[slot.stored][slot.camera]]
                taken[slot.stored][slot.camera] += 1
            if slot.position is None:
                plan.samples[slot.sample][slot.field] = image
            else:
                plan.samples[slot.sample][slot.field][slot.position] = image
        samples = plan.samples
        batch: dict[str, torch.Tensor | list[str]] = {
            key: torch.as_tensor(np.stack([s[key] for s in samples])) for key in samples[0]}
        batch["instruction"] = plan.instructions
        batch["weight"] = torch.ones(len(samples))
        batch["stream"] = torch.as_tensor(plan.streams, dtype=torch.int64)
        batch["reward"] = torch.tensor(plan.rewards)
        batch["is_intervention"] = torch.tensor(plan.flags)
        return batch

    def instructions(self) -> list[str]:
        """The distinct instructions held (normalisation statistics of a fresh policy)."""
        self._whole()
        with self._lock:
            return sorted({self._entries[k].instruction for k in self._keys})

    def states_and_actions(self) -> tuple[np.ndarray, np.ndarray]:
        """Every state and action held, for normalisation statistics of a fresh policy."""
        self._whole()
        with self._lock:
            views = [self._entries[k].view() for k in self._keys]
        if not views:
            raise LookupError("the index is empty")
        return np.concatenate([v["state"] for v in views]), np.concatenate([v["action"] for v in views])

    def _episode_rewards_locked(self, key: EntryKey, episode: dict, config: RewardConfig) -> EpisodeRewards:
        """Rewards of entry ``key``, computed once per (length, config): a batch samples many steps of one episode."""
        length = len(episode["action"])
        cached = self._rewards.get(key)
        if cached is not None and cached[0] == length and cached[1] == config:
            return cached[2]
        rewards = episode_rewards(episode, config)
        self._rewards[key] = (length, config, rewards)
        return rewards

    def _cumulative_locked(self) -> tuple[dict[str, np.ndarray], dict[str, list[EntryKey]]]:
        """Per stream, the cumulative step counts of the entries holding its steps, and those entries
        (kept until the content changes)."""
        if self._cumulative is None:
            self._cumulative, self._stream_keys = self._cumulative_of_locked(self._keys)
        return self._cumulative, self._stream_keys

    def _cumulative_of_locked(self, keys: Sequence[EntryKey]) -> tuple[dict[str, np.ndarray],
                                                                        dict[str, list[EntryKey]]]:
        cumulative, stream_keys = {}, {}
        for stream in STREAMS:
            held = [k for k in keys if len(self._positions[(k, stream)])]
            stream_keys[stream] = held
            cumulative[stream] = np.cumsum([len(self._positions[(k, stream)]) for k in held], dtype=np.int64)
        return cumulative, stream_keys
