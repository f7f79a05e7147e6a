"""The edge's on-disk spool: order, acks, restarts, torn writes, compaction."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from robot_rl.bridges.zmq import Spool, SpoolError

pytestmark = pytest.mark.timeout(60)


def _frames(i: int) -> list[bytes]:
    return [f"envelope-{i}".encode(), bytes([i % 256]) * (50 + i)]


def _fill(spool: Spool, n: int) -> None:
    for i in range(n):
        spool.append(f"1:{i}", _frames(i))


def test_pending_is_in_append_order_and_acks_remove(tmp_path):
    with Spool(tmp_path) as spool:
        _fill(spool, 5)
        assert spool.ack("1:1") and not spool.ack("1:1")  # a duplicate ack is harmless
        assert list(spool.pending()) == [(f"1:{i}", _frames(i)) for i in (0, 2, 3, 4)]
        assert len(spool) == 4 and "1:3" in spool and "1:1" not in spool


def test_reopening_gives_the_same_pending_set(tmp_path):
    with Spool(tmp_path) as spool:
        _fill(spool, 4)
        spool.ack("1:2")
    with Spool(tmp_path) as spool:
        assert list(spool.pending()) == [(f"1:{i}", _frames(i)) for i in (0, 1, 3)]
        spool.append("2:0", [b"after restart"])
    with Spool(tmp_path) as spool:
        assert spool.keys() == ["1:0", "1:1", "1:3", "2:0"]


@pytest.mark.parametrize("cut", [1, 7, 20, 40, -1])
def test_torn_last_record_is_dropped_and_earlier_records_survive(tmp_path, cut):
    with Spool(tmp_path) as spool:
        _fill(spool, 3)
        before_last = spool.size_bytes
        spool.append("1:3", _frames(3))
        full = spool.size_bytes
    size = full - 1 if cut == -1 else before_last + cut  # a crash mid-write of the last record
    os.truncate(tmp_path / "spool.log", size)
    with Spool(tmp_path) as spool:
        assert list(spool.pending()) == [(f"1:{i}", _frames(i)) for i in range(3)]
        assert (tmp_path / f"torn-{before_last}.bin").stat().st_size == size - before_last
        spool.append("1:3", _frames(3))  # appends after recovery start from a clean tail
    with Spool(tmp_path) as spool:
        assert spool.keys() == ["1:0", "1:1", "1:2", "1:3"]


def test_corrupted_last_record_fails_its_crc(tmp_path):
    with Spool(tmp_path) as spool:
        _fill(spool, 2)
        size = spool.size_bytes
    with open(tmp_path / "spool.log", "r+b") as f:
        f.seek(size - 3)
        f.write(b"\xff\xfe\xfd")
    with Spool(tmp_path) as spool:
        assert spool.keys() == ["1:0"]


def test_a_torn_ack_means_the_segment_is_sent_again_never_lost(tmp_path):
    with Spool(tmp_path) as spool:
        _fill(spool, 2)
        spool.ack("1:0")
        size = spool.size_bytes
    os.truncate(tmp_path / "spool.log", size - 2)
    with Spool(tmp_path) as spool:
        assert spool.keys() == ["1:0", "1:1"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 6), acked=st.sets(st.integers(0, 5)), cut_fraction=st.floats(0, 1))
def test_any_truncation_leaves_a_consistent_prefix(tmp_path_factory, n, acked, cut_fraction):
    directory = tmp_path_factory.mktemp("spool")
    ends = []
    with Spool(directory, compact_min_bytes=1 << 40) as spool:
        for i in range(n):
            spool.append(f"1:{i}", _frames(i))
            ends.append(("append", i, spool.size_bytes))
        for i in sorted(acked & set(range(n))):
            if len(spool) > 1:  # keep one pending so the log is not compacted away
                spool.ack(f"1:{i}")
                ends.append(("ack", i, spool.size_bytes))
        total = spool.size_bytes
    cut = int(total * cut_fraction)
    os.truncate(directory / "spool.log", cut)
    expected: dict[str, list[bytes]] = {}
    for kind, i, end in ends:  # replay exactly the records that fit before the cut
        if end <= cut:
            if kind == "append":
                expected[f"1:{i}"] = _frames(i)
            else:
                expected.pop(f"1:{i}")
    with Spool(directory) as spool:
        assert dict(spool.pending()) == expected


def test_log_is_emptied_when_everything_is_acked(tmp_path):
    with Spool(tmp_path) as spool:
        _fill(spool, 3)
        for i in range(3):
            spool.ack(f"1:{i}")
        assert spool.size_bytes == 0 and os.path.getsize(tmp_path / "spool.log") == 0
        spool.append("2:0", [b"x"])
    with Spool(tmp_path) as spool:
        assert spool.keys() == ["2:0"]


def test_compaction_rewrites_a_mostly_acked_log(tmp_path):
    with Spool(tmp_path, compact_min_bytes=500) as spool:
        _fill(spool, 10)
        for i in range(8):
            spool.ack(f"1:{i}")
        assert spool.size_bytes < 400  # rewritten with only the two pending records
        assert list(spool.pending()) == [(f"1:{i}", _frames(i)) for i in (8, 9)]
    with Spool(tmp_path) as spool:
        assert spool.keys() == ["1:8", "1:9"]


def test_one_process_per_spool_and_unique_keys(tmp_path):
    with Spool(tmp_path) as spool:
        with pytest.raises(SpoolError, match="in use by another process"):
            Spool(tmp_path)
        spool.append("1:0", [b"a"])
        with pytest.raises(SpoolError, match="already pending"):
            spool.append("1:0", [b"b"])
