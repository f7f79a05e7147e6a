"""A stored frame that no longer decodes (damaged PNG bytes inside a data file, a garbled video) costs
its episode, never the store or the trainer: left out when the learner reads its store in, quarantined
when training reads it back, said in one line naming the file. A video file damaged before the newest
one is refused at start, in one line naming it."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from robot_rl.core.errors import CorruptFileError
from robot_rl.data.validation import check_dataset
from robot_rl.learner.store import ReplayStore
from tests.learner_helpers import store_config
from tests.test_learner_index_memory import BUDGET_MB, RATIOS, SPEC, fill_store

IMAGES = "observation.images.front"


def damage_images(dataset: Path, episode: int) -> Path:
    """Garbled PNG bytes in every frame of ``episode``, inside a data file that is still valid parquet
    (the damage a bad sector leaves in an image, which no parquet footer or column check sees)."""
    for path in sorted(dataset.glob("data/chunk-*/file-*.parquet")):
        table = pq.read_table(path)
        rows = table.column(IMAGES).to_pylist()
        episodes = table.column("episode_index").to_pylist()
        if episode not in episodes:
            continue
        for i, ep in enumerate(episodes):
            if ep == episode:
                data = bytearray(rows[i]["bytes"])
                data[12:-12] = b"\xff" * (len(data) - 24)
                rows[i] = {**rows[i], "bytes": bytes(data)}
        index = table.schema.get_field_index(IMAGES)
        table = table.set_column(index, table.schema.field(index), pa.array(rows, type=table.schema.field(index).type))
        pq.write_table(table, path)
        return path
    raise AssertionError(f"episode {episode} is in no data file of {dataset}")


def sample(store: ReplayStore, seed: int) -> int:
    """A batch's size: training draws batches."""
    return len(store.index.sample(64, RATIOS, SPEC, np.random.default_rng(seed))["weight"])


def indexed_episodes(store: ReplayStore) -> list[int]:
    return [episode for _, episode, _, _ in store.index.manifest()]


def test_a_stored_episode_whose_frames_do_not_decode_is_left_out_when_the_store_is_read_in(tmp_path, caplog):
    with ReplayStore(store_config(tmp_path)) as store:
        list(fill_store(store, 3))
    damaged = damage_images(tmp_path / "dataset", episode=1)

    with ReplayStore(store_config(tmp_path)) as store:  # reads its dataset into the sampling index
        assert store.stats()["episodes_quarantined"] == 1
        assert indexed_episodes(store) == [0, 2]
        assert sample(store, 0) == 64  # training goes on
    said = [r.getMessage() for r in caplog.records if "dataset episode 1 does not decode" in r.getMessage()]
    assert len(said) == 1 and str(damaged) in said[0] and "\n" not in said[0] and "restore" in said[0]


def test_an_episode_whose_frames_stop_decoding_while_training_is_quarantined_and_training_goes_on(tmp_path, caplog):
    with ReplayStore(store_config(tmp_path, index_memory=BUDGET_MB, index_read_workers=0, index_spill=0)) as store:
        list(fill_store(store, 5))
        assert store.index.entries_on_disk >= 3  # episode 0's frames left memory: training reads them back
        damaged = damage_images(tmp_path / "dataset", episode=0)
        assert all(sample(store, seed) == 64 for seed in range(4))  # a batch that drew episode 0 is drawn again
        assert store.index.quarantined == [("r0", 0, 0)] and indexed_episodes(store) == [1, 2, 3, 4]
        assert store.stats()["episodes_quarantined"] == 1
    said = [r.getMessage() for r in caplog.records if "quarantined" in r.getMessage()]
    assert len(said) == 1 and str(damaged) in said[0] and "\n" not in said[0]


@pytest.fixture
def video_dataset(tmp_path) -> Path:
    """A video-stored dataset written in three sittings: three video files."""
    from robot_rl.data.frame_storage import FrameStorageConfig
    from robot_rl.data.recorder import EpisodeRecorder
    from tests.test_data_recorder import CAMS, JOINTS, make_episode

    root = tmp_path / "ds"
    for episode in range(3):
        with EpisodeRecorder(root, fps=30, joint_names=JOINTS, cameras=CAMS,
                             frames=FrameStorageConfig(images="video")) as recorder:
            recorder.write_episode(make_episode(episode, 6, 1))
    return root


def videos(root: Path) -> list[Path]:
    return sorted(root.glob("videos/*/chunk-*/file-*.mp4"))


def test_a_truncated_video_file_is_one_line_naming_it_at_start_unless_it_is_the_newest(video_dataset):
    first, newest = videos(video_dataset)[0], videos(video_dataset)[-1]
    assert len(videos(video_dataset)) == 3
    os.truncate(newest, newest.stat().st_size // 2)
    check_dataset(video_dataset)  # the newest cut short is what a killed writer leaves: opening rolls it back
    os.truncate(first, first.stat().st_size // 2)
    with pytest.raises(CorruptFileError) as refused:
        check_dataset(video_dataset)
    assert refused.value.path == first and "\n" not in str(refused.value) and "restore it" in str(refused.value)
