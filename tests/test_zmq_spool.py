"""The edge's on-disk spool: order, acks, restarts, torn writes, compaction."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from robot_rl.bridges.zmq import Spool, SpoolError
from robot_rl.bridges.zmq.spool import SpoolFullError

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
        assert (tmp_path / f"corrupt-{before_last}.bin").stat().st_size == size - before_last
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


def test_a_reader_reads_the_records_it_was_given_through_compaction_and_never_another_records_bytes(tmp_path):
    """What a restarted learner's index thread reads its staged backlog through, while ingest appends
    and the commit thread acks (compacting the log, or cutting an all-acked one to zero)."""
    with Spool(tmp_path, compact_min_bytes=500) as spool:
        _fill(spool, 10)
        reader = spool.reader([f"1:{i}" for i in range(10)] + ["not staged"])
        for i in range(8):
            spool.ack(f"1:{i}")
        assert spool.size_bytes < 400  # compacted: the path holds a new file
        assert reader.read("1:3") == _frames(3) and reader.read("1:9") == _frames(9)
        assert reader.read("not staged") is None
        reader.close()
        reader = spool.reader(["1:8", "1:9"])
        spool.ack("1:8")
        spool.ack("1:9")  # all acked: the log is cut to zero in place ...
        _fill(spool, 10)  # ... and filled again from its start with other records
        assert reader.read("1:8") is None and reader.read("1:9") is None
        reader.close()


def test_one_process_per_spool_and_unique_keys(tmp_path):
    with Spool(tmp_path) as spool:
        with pytest.raises(SpoolError, match="in use by another process"):
            Spool(tmp_path)
        spool.append("1:0", [b"a"])
        with pytest.raises(SpoolError, match="already pending"):
            spool.append("1:0", [b"b"])


# ---------------------------------------------------------------- bad records, full disks


def _record_ends(spool: Spool, n: int) -> list[tuple[int, int]]:
    """Append n records; the (start, end) byte range of each."""
    ranges = []
    for i in range(n):
        start = spool.size_bytes
        spool.append(f"1:{i}", _frames(i))
        ranges.append((start, spool.size_bytes))
    return ranges


def test_a_garbled_record_in_the_middle_costs_that_record_and_no_later_one(tmp_path):
    with Spool(tmp_path) as spool:
        ranges = _record_ends(spool, 9)
    start, end = ranges[1]
    with open(tmp_path / "spool.log", "r+b") as f:  # 4 garbled bytes inside record 1
        f.seek(start + 30)
        f.write(b"\xde\xad\xbe\xef")
    with Spool(tmp_path) as spool:
        assert spool.keys() == [f"1:{i}" for i in range(9) if i != 1]
        assert all(frames == _frames(int(key[2:])) for key, frames in spool.pending())
        assert (tmp_path / f"corrupt-{start}.bin").stat().st_size == end - start
        spool.append("2:0", [b"after"])
    with Spool(tmp_path) as spool:  # the rewritten log is clean: nothing more is skipped
        assert spool.keys()[-1] == "2:0" and len(spool) == 9 and spool.corrupt_regions == []


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(2, 8), hits=st.lists(st.tuples(st.floats(0, 1), st.binary(min_size=1, max_size=6)),
                                          min_size=1, max_size=3))
def test_every_record_no_garbled_byte_touched_survives(tmp_path_factory, n, hits):
    directory = tmp_path_factory.mktemp("spool")
    with Spool(directory) as spool:
        ranges = _record_ends(spool, n)
        total = spool.size_bytes
    touched: set[int] = set()
    with open(directory / "spool.log", "r+b") as f:
        for where, garbage in hits:
            offset = min(int(where * total), total - len(garbage))
            f.seek(offset)
            original = f.read(len(garbage))
            if original == garbage:
                continue
            f.seek(offset)
            f.write(garbage)
            touched |= {i for i, (s, e) in enumerate(ranges) if s < offset + len(garbage) and offset < e}
    with Spool(directory) as spool:
        assert spool.keys() == [f"1:{i}" for i in range(n) if i not in touched]


def test_a_write_that_fails_half_way_is_undone_and_the_next_appends_read_back_exactly(tmp_path, monkeypatch):
    """A full disk: os.write writes part of a record, then fails. The log is cut back, the caller is
    told, and the records after it land where the index expects them."""
    import errno

    import robot_rl.bridges.zmq.spool as spool_module

    real_write = os.write
    failures = [1]

    def full_disk(fd, data):
        if failures and len(data) > 40:
            failures.pop()
            real_write(fd, bytes(data[:17]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    with Spool(tmp_path) as spool:
        _fill(spool, 2)
        monkeypatch.setattr(spool_module.os, "write", full_disk)
        with pytest.raises(OSError, match="No space"):
            spool.append("1:2", _frames(2))
        assert spool.write_errors == 1 and "1:2" not in spool
        spool.append("1:2", _frames(2))  # the retry, once there is room again
        spool.append("1:3", _frames(3))
        assert [spool.get(f"1:{i}") for i in range(4)] == [_frames(i) for i in range(4)]
    monkeypatch.undo()
    with Spool(tmp_path) as spool:
        assert list(spool.pending()) == [(f"1:{i}", _frames(i)) for i in range(4)]
        assert spool.corrupt_regions == []


def test_a_full_spool_refuses_new_records_keeps_the_oldest_and_takes_more_once_acked(tmp_path):
    with Spool(tmp_path, max_bytes=400) as spool:
        appended = 0
        with pytest.raises(SpoolFullError, match="not acked"):
            while True:
                spool.append(f"1:{appended}", _frames(appended))
                appended += 1
        assert appended > 1 and spool.keys() == [f"1:{i}" for i in range(appended)]
        spool.ack("1:0")
        spool.append(f"1:{appended}", _frames(appended))
        assert spool.keys()[0] == "1:1" and spool.keys()[-1] == f"1:{appended}"


def test_a_spool_that_fails_to_open_releases_its_lock(tmp_path, monkeypatch):
    with Spool(tmp_path) as spool:
        _fill(spool, 1)
    monkeypatch.setattr(Spool, "_recover", lambda self: (_ for _ in ()).throw(OSError("disk gone")))
    with pytest.raises(OSError, match="disk gone"):
        Spool(tmp_path)
    monkeypatch.undo()
    with Spool(tmp_path) as spool:  # no "in use by another process": the failed open closed its descriptor
        assert spool.keys() == ["1:0"]
