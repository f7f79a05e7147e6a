"""The sampling index keeps frames at the policy's input size, under a memory budget, and reads the
frames it let go back from the dataset exactly as they were."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

from robot_rl.learner.config import TrainerConfig
from robot_rl.learner.index import SampleSpec, SamplingIndex, steps_to_columns
from robot_rl.learner.store import ReplayStore
from robot_rl.policies.trainable import InputFrames
from tests.learner_helpers import CAMERAS, IMG, make_steps, store_config, tiny_policy
from tests.test_learner_store import segments

SPEC = SampleSpec(chunk_size=4, cameras=CAMERAS, max_state_offset=2)
RATIOS = TrainerConfig().stream_ratios


def camera_steps(n: int, episode: int, height: int, width: int):
    """Steps whose frames are a camera's size and differ across the frame (a gradient that moves per tick)."""
    steps = make_steps(n, episode=episode)
    rows = np.arange(height, dtype=np.int64)[:, None, None]
    cols = np.arange(width, dtype=np.int64)[None, :, None]
    for s in steps:
        s.images = {"front": ((rows + 2 * cols + 9 * s.tick + 31 * episode + np.arange(3)) % 256).astype(np.uint8)}
    return steps


def test_a_policys_declared_input_size_decides_what_the_index_keeps():
    policy = tiny_policy()  # FlowVLA reading 16x16
    assert policy.input_frames == {"front": InputFrames(IMG, IMG)}
    steps = camera_steps(20, 0, 480, 640)
    index = SamplingIndex(CAMERAS, policy.input_frames)
    index.append(("r0", 0, 0), steps_to_columns(steps, CAMERAS), "pick the cube")
    assert index.frame_bytes <= 32 * IMG * IMG * 3  # buffers of the policy's size, never 640x480
    batch = index.sample(8, RATIOS, SPEC, np.random.default_rng(0))
    assert batch["images.front"].shape == (8, IMG, IMG, 3)
    # The kept frames are the policy's own resize of the camera frames: what it would have read.
    kept = InputFrames(IMG, IMG).apply(np.stack([s.images["front"] for s in steps]))
    original = torch.as_tensor(np.stack([s.images["front"] for s in steps])).permute(0, 3, 1, 2).float() / 255
    model_view = torch.nn.functional.interpolate(original, size=(IMG, IMG), mode="bilinear", antialias=True)
    assert np.abs(kept.astype(np.float32) / 255 - model_view.permute(0, 2, 3, 1).numpy()).max() <= 0.5 / 255 + 1e-6
    # A policy that declares nothing keeps frames as they arrive.
    as_arrived = SamplingIndex(CAMERAS)
    as_arrived.append(("r0", 0, 0), steps_to_columns(steps, CAMERAS), "pick the cube")
    assert as_arrived.sample(2, RATIOS, SPEC, np.random.default_rng(0))["images.front"].shape == (2, 480, 640, 3)


@pytest.mark.parametrize(("kind", "expected"), [
    ("smolvla", InputFrames(512, 512, "pad_top_left")),
    ("pi0", InputFrames(224, 224, "pad_center")),
    ("act", InputFrames(96, 128)),
])
def test_lerobot_policies_declare_their_configs_input_size(kind, expected):
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.factory import make_policy_config

    from robot_rl.policies.lerobot_adapter import _input_frames

    config = make_policy_config(kind)
    config.input_features = {"observation.images.front": PolicyFeature(FeatureType.VISUAL, (3, 96, 128))}
    assert _input_frames(config, "observation.images.front") == expected


def test_padded_fits_are_lerobots_resize_with_its_bars():
    frames = np.full((1, 480, 640, 3), 200, dtype=np.uint8)
    top_left = InputFrames(512, 512, "pad_top_left").apply(frames)[0]
    assert top_left.shape == (512, 512, 3)
    assert (top_left[:128] == 0).all() and (top_left[128:] == 200).all()  # 640x480 -> 512x384, bars on top
    centred = InputFrames(224, 224, "pad_center").apply(frames)[0]
    assert (centred[:28] == 0).all() and (centred[28:196] == 200).all() and (centred[196:] == 0).all()


def test_a_finished_episode_holds_its_numbers_rows_and_no_spare_ones():
    """An episode's buffers grow by doubling while its segments arrive. The numbers a finished one keeps
    for as long as the learner runs must be its rows only: spare rows of thousands of episodes are memory
    that grows with the fleet's hours. (Its frames' buffers count against the budget as they are.)"""
    index = SamplingIndex(CAMERAS)
    steps = make_steps(40, episode=0)  # segments of 8 grow each buffer 16 -> 32 -> 64 rows
    for start in range(0, 40, 8):
        index.append(("r0", 0, 0), steps_to_columns(steps[start:start + 8], CAMERAS), "pick the cube")
    row = {name: col for name, col in steps_to_columns(steps[:1], CAMERAS).items() if not name.startswith("images.")}
    held = index._entries[("r0", 0, 0)]._arrays
    assert sum(held[name].nbytes for name in row) == 40 * sum(col.nbytes for col in row.values())
    assert index.frame_bytes == sum(buf.nbytes for name, buf in held.items() if name.startswith("images."))


def fill_store(store: ReplayStore, episodes: int, length: int = 40) -> Iterator[list]:
    """Stream ``episodes`` episodes of robot r0 into ``store``, yielding each one's steps once it is stored."""
    for ep in range(episodes):
        steps = camera_steps(length, ep, IMG, IMG)
        for seg in segments("r0", ep, steps, size=8):
            store.ingest(seg)
        yield steps


BUDGET_MB = 0.06  # ~63 kB: one 40-step episode of 16x16 frames holds 49 kB in its buffers
EPISODE_MB = 40 * IMG * IMG * 3 / 2**20  # one 40-step episode's frames, as spilled (no buffer slack)


def frames_let_go(store: ReplayStore) -> int:
    """Entries whose frames left the index's memory, to the spill or back to the dataset."""
    return store.index.entries_spilled + store.index.entries_on_disk


def assert_same_batches(index: SamplingIndex, reference: SamplingIndex, seeds: range) -> None:
    for seed in seeds:
        read_back = index.sample(32, RATIOS, SPEC, np.random.default_rng(seed))
        kept = reference.sample(32, RATIOS, SPEC, np.random.default_rng(seed))
        assert read_back.keys() == kept.keys()
        for key, value in kept.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, read_back[key]), key
            else:
                assert value == read_back[key], key


@pytest.mark.parametrize("spill_mb", [None, 0.0], ids=["spill", "dataset"])
def test_the_index_stays_under_a_tiny_budget_while_episodes_keep_arriving(tmp_path, spill_mb):
    with ReplayStore(store_config(tmp_path, index_memory=BUDGET_MB, index_spill=spill_mb)) as store:
        budget = store.index.memory_budget
        assert budget == int(BUDGET_MB * (1 << 20))
        for n, _ in enumerate(fill_store(store, 8), start=1):
            assert store.index.frame_bytes <= budget, f"after episode {n}"
            assert sum(store.index.counts().values()) == 40 * n  # every step is still sampled from
        assert (store.index.entries_spilled if spill_mb is None else store.index.entries_on_disk) >= 6
        batch = store.index.sample(64, RATIOS, SPEC, np.random.default_rng(1))
        assert len({int(s[1]) for s in batch["state"]}) >= 6  # episodes whose frames left memory are drawn


@pytest.mark.parametrize("workers", [0, 1])
def test_frames_read_back_after_eviction_equal_the_kept_ones_bit_for_bit(tmp_path, workers):
    reference = SamplingIndex(CAMERAS)
    config = store_config(tmp_path, index_memory=BUDGET_MB, index_read_workers=workers, index_spill=0)
    with ReplayStore(config) as store:
        for ep, steps in enumerate(fill_store(store, 5)):
            reference.append(("r0", ep, 0), steps_to_columns(steps, CAMERAS), "pick the cube")
        assert store.index.entries_on_disk >= 3
        assert_same_batches(store.index, reference, range(3))


def test_spilled_frames_come_back_bit_for_bit_without_a_decoder_or_a_reader_process(tmp_path):
    """The spill holds the bytes the index held: no reader process starts, no video or PNG is decoded."""
    from robot_rl.data.frame_storage import FrameStorageConfig

    reference = SamplingIndex(CAMERAS)
    config = store_config(tmp_path, index_memory=BUDGET_MB, index_read_workers=1,
                          frames=FrameStorageConfig(images="video", video_crf=30))  # lossy: a decode would show
    with ReplayStore(config) as store:
        for ep, steps in enumerate(fill_store(store, 5)):
            reference.append(("r0", ep, 0), steps_to_columns(steps, CAMERAS), "pick the cube")
        assert store.index.entries_spilled >= 3 and store.index.entries_on_disk == 0
        assert_same_batches(store.index, reference, range(3))
        assert store.frame_reader.worker_pids() == []
        assert sorted(p.name for p in (tmp_path / "index_spill").iterdir())  # frames on disk, not in memory


def test_a_full_spill_hands_its_oldest_stored_episodes_back_to_the_dataset(tmp_path):
    """Bounded disk: past ``index_spill`` the oldest spilled episodes the dataset holds leave the spill and
    are read back from the dataset; batches are the same wherever each episode's frames are."""
    reference = SamplingIndex(CAMERAS)
    config = store_config(tmp_path, index_memory=BUDGET_MB, index_read_workers=0, index_spill=3 * EPISODE_MB)
    with ReplayStore(config) as store:
        for ep, steps in enumerate(fill_store(store, 8)):
            reference.append(("r0", ep, 0), steps_to_columns(steps, CAMERAS), "pick the cube")
            assert store.frame_spill is not None and store.frame_spill.bytes <= store.frame_spill.max_bytes
        assert 1 <= store.index.entries_spilled <= 3 and store.index.entries_on_disk >= 3
        assert sorted(store.index._on_disk)[0] == ("r0", 0, 0)  # the oldest went first
        assert_same_batches(store.index, reference, range(3))


def test_a_spill_whose_disk_fills_says_so_once_and_frames_leave_for_the_dataset_instead(tmp_path, monkeypatch,
                                                                                          caplog):
    import errno

    import robot_rl.learner.frame_spill as frame_spill

    def full_disk(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(frame_spill, "_write_all", full_disk)
    reference = SamplingIndex(CAMERAS)
    with ReplayStore(store_config(tmp_path, index_memory=BUDGET_MB, index_read_workers=0)) as store:
        for ep, steps in enumerate(fill_store(store, 6)):
            reference.append(("r0", ep, 0), steps_to_columns(steps, CAMERAS), "pick the cube")
            assert store.index.frame_bytes <= store.index.memory_budget
        assert store.index.entries_spilled == 0 and store.index.entries_on_disk >= 4
        assert_same_batches(store.index, reference, range(2))
    said = [r.getMessage() for r in caplog.records if "frame spill" in r.getMessage()]
    assert len(said) == 1 and "No space left" in said[0] and "\n" not in said[0]


def test_an_episode_closed_early_takes_its_re_sent_steps_after_its_frames_went_to_the_spill(tmp_path):
    """A robot held back re-sends an episode's last segments after it has started the next one: the store
    closed that episode early and its frames left for the spill. The late steps join it; none is lost."""
    from robot_rl.learner.frame_spill import FrameSpill
    from robot_rl.learner.stored_frames import FrameReader

    spill = FrameSpill(tmp_path / "spill", 1 << 20)
    index = SamplingIndex(CAMERAS, memory_budget=int(BUDGET_MB * (1 << 20)), reader=FrameReader({}, 0), spill=spill)
    reference = SamplingIndex(CAMERAS)
    steps = {ep: camera_steps(40, ep, IMG, IMG) for ep in range(4)}
    first, late = steps[0][:24], steps[0][24:]
    for target in (index, reference):
        target.append(("r0", 0, 0), steps_to_columns(first, CAMERAS), "pick the cube")
    for target in (index, reference):
        target.mark_finished(("r0", 0, 0))  # closed early: its robot started episode 1
    for ep in (1, 2, 3):
        index.append(("r0", ep, 0), steps_to_columns(steps[ep], CAMERAS), "pick the cube")
        reference.append(("r0", ep, 0), steps_to_columns(steps[ep], CAMERAS), "pick the cube")
    assert ("r0", 0, 0) in index._spilled
    index.append(("r0", 0, 0), steps_to_columns(late, CAMERAS), "pick the cube")  # the re-sent segments
    reference.append(("r0", 0, 0), steps_to_columns(late, CAMERAS), "pick the cube")
    assert sum(index.counts().values()) == 4 * 40 and index.frame_bytes <= index.memory_budget
    assert_same_batches(index, reference, range(3))
    spill.close()


def test_a_spill_file_deleted_under_the_learner_is_one_clear_error_not_an_endless_redraw(tmp_path):
    with ReplayStore(store_config(tmp_path, index_memory=BUDGET_MB, index_read_workers=0)) as store:
        list(fill_store(store, 5))
        assert store.index.entries_spilled >= 3
        for path in (tmp_path / "index_spill").iterdir():
            path.unlink()
        with pytest.raises(RuntimeError, match="frame spill lost a file .* restart the learner"):
            for seed in range(8):  # some batch draws a spilled episode
                store.index.sample(32, RATIOS, SPEC, np.random.default_rng(seed))


def test_a_batch_whose_spill_file_was_dropped_since_its_plan_is_drawn_again_the_same(tmp_path, monkeypatch):
    import robot_rl.learner.index as index_module

    reference = SamplingIndex(CAMERAS)
    with ReplayStore(store_config(tmp_path, index_memory=BUDGET_MB, index_read_workers=0)) as store:
        for ep, steps in enumerate(fill_store(store, 5)):
            reference.append(("r0", ep, 0), steps_to_columns(steps, CAMERAS), "pick the cube")
        read_spilled, calls = index_module.read_spilled, []

        def dropped_once(wanted):
            calls.append(len(wanted))
            if len(calls) == 1:
                raise FileNotFoundError("frames-000000.bin")
            return read_spilled(wanted)

        monkeypatch.setattr(index_module, "read_spilled", dropped_once)
        assert_same_batches(store.index, reference, range(1))
    assert len(calls) == 2 and calls[0] == calls[1] > 0  # the same frames asked again: the same draw


def test_video_frames_read_back_after_eviction_are_within_the_codecs_tolerance(tmp_path):
    from robot_rl.data.frame_storage import FrameStorageConfig

    reference = SamplingIndex(CAMERAS)
    config = store_config(tmp_path, index_memory=BUDGET_MB, index_read_workers=0, index_spill=0,
                          frames=FrameStorageConfig(images="video", video_crf=10))
    with ReplayStore(config) as store:
        for ep, steps in enumerate(fill_store(store, 4)):
            reference.append(("r0", ep, 0), steps_to_columns(steps, CAMERAS), "pick the cube")
        assert store.index.entries_on_disk >= 2
        read_back = store.index.sample(32, RATIOS, SPEC, np.random.default_rng(0))
        kept = reference.sample(32, RATIOS, SPEC, np.random.default_rng(0))
    assert torch.equal(read_back["state"], kept["state"])
    for key in ("images.front", "next.images.front"):
        error = (read_back[key].float() - kept[key].float()).abs()
        assert error.mean() <= 6.0, (key, float(error.mean()))  # h264 at crf 10: a few levels per pixel


def test_frame_readers_start_before_the_first_read_back_and_never_import_lerobot_datasets(tmp_path):
    """A reader process's memory is torch and torchcodec, not LeRobot's dataset stack (~370 MB more of
    each), and the readers are up before a batch needs them, not started by it."""
    from robot_rl.data.frame_storage import FrameStorageConfig

    config = store_config(tmp_path, index_memory=BUDGET_MB, index_read_workers=1, index_spill=0,
                          frames=FrameStorageConfig(images="video", video_crf=10))
    with ReplayStore(config) as store:
        for _ in fill_store(store, 3):
            pass
        assert store.index.entries_on_disk >= 1
        assert len(store.frame_reader.worker_pids()) == 1  # started ahead: no batch has been drawn
        stored = next(iter(store.index._on_disk.values()))
    probe = ("import sys, json; from robot_rl.learner.stored_frames import StoredEpisode, read_stored_frames; "
             f"frames = read_stored_frames(StoredEpisode({stored.root!r}, {stored.repo_id!r}, "
             f"{stored.episode_index}), {{'front': [0, 5, 5, 2]}}, {{}}); "
             "print(json.dumps([list(frames['front'].shape), 'lerobot.datasets' in sys.modules]))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True)
    shape, imported = json.loads(result.stdout.strip().splitlines()[-1])
    assert shape == [4, IMG, IMG, 3]
    assert not imported


@pytest.mark.parametrize("spill_mb", [None, 0.0], ids=["spill", "dataset"])
def test_a_writer_behind_never_grows_the_index_past_its_budget(tmp_path, spill_mb):
    """With the writer lingering over a batch of 100, the closed episodes it has not written would pile up
    in the index. With a spill they leave memory for it and robots are never held back; without one only
    stored episodes' frames can leave, so past the budget the store refuses segments instead (the robot
    re-sends them) and the writer writes what it has at once."""
    from robot_rl.bridges.zmq.codec import BusyError

    config = store_config(tmp_path, index_memory=BUDGET_MB, background_commit=True, commit_batch=100,
                          commit_linger_s=60.0, index_spill=spill_mb)
    refused, peak = 0, 0
    with ReplayStore(config) as store:
        for ep in range(6):
            for seg in segments("r0", ep, camera_steps(40, ep, IMG, IMG), size=8):
                while True:
                    try:
                        store.ingest(seg)
                        break
                    except BusyError:
                        refused += 1
                        time.sleep(0.05)
                store.flush_index(10.0)
                peak = max(peak, store.index.frame_bytes)
        assert store.flush(60.0)
        assert sum(store.index.counts().values()) == 6 * 40  # every step in, none lost
    assert (refused == 0) if spill_mb is None else (refused > 0)
    episode_bytes = 50_000  # one 40-step episode of 16x16 frames in its buffers
    assert peak <= store.index.memory_budget + 2 * episode_bytes  # the budget, the open and the closing episode


@contextlib.contextmanager
def store_read_back_by_one_reader(tmp_path) -> Iterator[tuple[ReplayStore, SamplingIndex]]:
    """A store whose frames are read back from its dataset by one reader process, already started; and
    an index that keeps every frame in memory, to say what a read back must give."""
    reference = SamplingIndex(CAMERAS)
    with ReplayStore(store_config(tmp_path, index_memory=BUDGET_MB, index_read_workers=1, index_spill=0)) as store:
        for ep, steps in enumerate(fill_store(store, 4)):
            reference.append(("r0", ep, 0), steps_to_columns(steps, CAMERAS), "pick the cube")
        store.index.sample(8, RATIOS, SPEC, np.random.default_rng(0))
        yield store, reference


def test_a_frame_reader_killed_mid_run_is_replaced_and_the_batch_read_again(tmp_path):
    """A reader killed (for memory, or by hand) breaks its process pool for good: training would stop.
    New readers take over, and the batch is the one the dead reader would have read."""
    import signal

    with store_read_back_by_one_reader(tmp_path) as (store, reference):
        (dead,) = store.frame_reader.worker_pids()
        os.kill(dead, signal.SIGKILL)
        time.sleep(0.5)  # the pool notices its worker gone
        read_back = store.index.sample(32, RATIOS, SPEC, np.random.default_rng(1))
        assert store.frame_reader.worker_pids() and dead not in store.frame_reader.worker_pids()
    kept = reference.sample(32, RATIOS, SPEC, np.random.default_rng(1))
    assert torch.equal(read_back["images.front"], kept["images.front"])


def test_a_terminal_ctrl_c_leaves_the_frame_readers_to_the_learner(tmp_path):
    """A Ctrl-C reaches every process of the terminal's group. A reader that took it would die mid-read
    with a traceback; it ignores it, and the learner shuts its readers down in its own stop."""
    import signal

    with store_read_back_by_one_reader(tmp_path) as (store, reference):
        (reader,) = store.frame_reader.worker_pids()
        os.kill(reader, signal.SIGINT)
        time.sleep(0.5)  # time enough for a reader that took it to die, and for its pool to notice
        read_back = store.index.sample(32, RATIOS, SPEC, np.random.default_rng(1))
        assert store.frame_reader.worker_pids() == [reader]
    kept = reference.sample(32, RATIOS, SPEC, np.random.default_rng(1))
    assert torch.equal(read_back["images.front"], kept["images.front"])
