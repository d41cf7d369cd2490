"""The simulated disk keeps exactly the durability promises of a real one, and no more."""

from __future__ import annotations

import errno
import random

import pytest

from service.testing.simdisk import SimFileSystem


def make_fs() -> SimFileSystem:
    fs = SimFileSystem()
    fs.makedirs("/d")
    return fs


def test_synced_bytes_survive_a_crash() -> None:
    fs = make_fs()
    f = fs.open_append("/d/f")
    f.write(b"hello")
    f.sync()
    fs.fsync_dir("/d")
    fs.crash(random.Random(0))
    assert fs.read_bytes("/d/f") == b"hello"


def test_unsynced_appends_leave_a_random_prefix() -> None:
    seen = set()
    for seed in range(200):
        fs = make_fs()
        f = fs.open_append("/d/f")
        f.write(b"durable|")
        f.sync()
        fs.fsync_dir("/d")
        f.write(b"volatile-tail")
        fs.crash(random.Random(seed))
        got = fs.read_bytes("/d/f")
        assert (b"durable|" + b"volatile-tail").startswith(got)
        assert got.startswith(b"durable|")
        seen.add(len(got))
    # Cuts land everywhere, including nothing kept and everything kept.
    assert seen == set(range(len(b"durable|"), len(b"durable|volatile-tail") + 1))


def test_crash_is_deterministic_given_the_rng() -> None:
    def run(seed: int) -> dict[str, bytes]:
        fs = make_fs()
        for name in ("a", "b", "c"):
            f = fs.open_append(f"/d/{name}")
            f.write(b"x" * 10)
            f.sync()
            f.write(b"y" * 50)
        fs.fsync_dir("/d")
        fs.crash(random.Random(seed))
        return {p: fs.read_bytes(p) for p in fs.files()}

    assert run(7) == run(7)
    assert any(run(7) != run(s) for s in range(8, 20))


def test_overwrite_of_preallocated_zeros_tears_within_the_file() -> None:
    for seed in range(50):
        fs = make_fs()
        f = fs.open_append("/d/f")
        f.preallocate(64)
        f.write(b"head")
        f.sync()
        fs.fsync_dir("/d")
        f.write(b"ABCDEFGH")
        assert f.tell() == 12
        fs.crash(random.Random(seed))
        got = fs.read_bytes("/d/f")
        assert len(got) == 64  # the size was synced with the first write
        assert got[:4] == b"head"
        written = got[4:12].rstrip(b"\0")
        assert b"ABCDEFGH".startswith(written)
        assert got[4 + len(written) :] == bytes(64 - 4 - len(written))


def test_file_created_without_dir_fsync_disappears() -> None:
    fs = make_fs()
    f = fs.open_append("/d/f")
    f.write(b"data")
    f.sync()  # the content is durable, but nothing durable names it
    fs.crash(random.Random(0))
    assert not fs.exists("/d/f")
    assert fs.listdir("/d") == []


def test_rename_and_remove_revert_without_dir_fsync() -> None:
    fs = make_fs()
    for name in ("a", "b"):
        f = fs.open_append(f"/d/{name}")
        f.write(name.encode())
        f.sync()
    fs.fsync_dir("/d")
    fs.rename("/d/a", "/d/c")
    fs.remove("/d/b")
    assert fs.listdir("/d") == ["c"]
    fs.crash(random.Random(0))
    assert fs.listdir("/d") == ["a", "b"]
    assert fs.read_bytes("/d/a") == b"a"

    fs.rename("/d/a", "/d/c")
    fs.remove("/d/b")
    fs.fsync_dir("/d")
    fs.crash(random.Random(0))
    assert fs.listdir("/d") == ["c"]
    assert fs.read_bytes("/d/c") == b"a"


def test_unsynced_rename_over_a_file_keeps_the_old_inode() -> None:
    fs = make_fs()
    for name, data in (("target", b"old"), ("tmp", b"new")):
        f = fs.open_append(f"/d/{name}")
        f.write(data)
        f.sync()
    fs.fsync_dir("/d")
    fs.rename("/d/tmp", "/d/target")
    assert fs.read_bytes("/d/target") == b"new"
    fs.crash(random.Random(1))
    assert fs.read_bytes("/d/target") == b"old"
    assert fs.read_bytes("/d/tmp") == b"new"


def test_write_atomic_is_durable_and_replaces() -> None:
    fs = make_fs()
    fs.write_atomic("/d/meta", b"one")
    fs.write_atomic("/d/meta", b"two")
    fs.crash(random.Random(0))
    assert fs.read_bytes("/d/meta") == b"two"
    assert fs.listdir("/d") == ["meta"]


def test_handles_die_in_a_crash() -> None:
    fs = make_fs()
    f = fs.open_append("/d/f")
    fs.fsync_dir("/d")
    fs.crash(random.Random(0))
    with pytest.raises(OSError) as info:
        f.write(b"x")
    assert info.value.errno == errno.EBADF
    with pytest.raises(OSError):
        f.sync()


def test_fail_next_sync_matches_skips_and_keeps_data_volatile() -> None:
    fs = make_fs()
    a = fs.open_append("/d/a")
    b = fs.open_append("/d/b")
    fs.fsync_dir("/d")
    fs.fail_next_sync("/d/b", skip=1)
    a.write(b"aaa")
    a.sync()  # does not match
    b.write(b"bbb")
    b.sync()  # matches, skipped
    b.write(b"BBB")
    with pytest.raises(OSError) as info:
        b.sync()
    assert info.value.errno == errno.EIO
    b.sync()  # the fault fires once
    fs.fail_next_sync()
    b.write(b"ccc")
    with pytest.raises(OSError):
        b.sync()
    assert fs.durable_bytes("/d/b") == b"bbbBBB"
    assert fs.read_bytes("/d/b") == b"bbbBBBccc"


def test_failed_write_atomic_leaves_the_old_content() -> None:
    for skip in (0, 1):  # 0: the temporary file's fsync fails, 1: the directory fsync fails
        for seed in range(10):
            fs = make_fs()
            fs.write_atomic("/d/meta", b"old")
            fs.fail_next_sync("/d", skip=skip)
            with pytest.raises(OSError):
                fs.write_atomic("/d/meta", b"new")
            fs.crash(random.Random(seed))
            assert fs.read_bytes("/d/meta") == b"old"


def test_corrupt_changes_durable_and_volatile_bytes() -> None:
    fs = make_fs()
    f = fs.open_append("/d/f")
    f.write(b"0123456789")
    f.sync()
    fs.fsync_dir("/d")
    fs.corrupt("/d/f", 3, b"XY")
    assert fs.read_bytes("/d/f") == b"012XY56789"
    fs.crash(random.Random(0))
    assert fs.read_bytes("/d/f") == b"012XY56789"
    with pytest.raises(ValueError):
        fs.corrupt("/d/f", 9, b"XY")


def test_unsynced_truncate_may_or_may_not_persist() -> None:
    outcomes = set()
    for seed in range(40):
        fs = make_fs()
        f = fs.open_append("/d/f")
        f.write(b"0123456789")
        f.sync()
        fs.fsync_dir("/d")
        f.truncate(4)
        assert f.tell() == 4
        fs.crash(random.Random(seed))
        outcomes.add(fs.read_bytes("/d/f"))
    assert outcomes == {b"0123", b"0123456789"}


def test_namespace_errors() -> None:
    fs = make_fs()
    with pytest.raises(FileNotFoundError):
        fs.open_append("/missing/f")
    with pytest.raises(FileNotFoundError):
        fs.read_bytes("/d/nope")
    with pytest.raises(FileNotFoundError):
        fs.remove("/d/nope")
    with pytest.raises(IsADirectoryError):
        fs.open_append("/d")
    fs.makedirs("/d/e/f")
    assert fs.exists("/d/e") and fs.exists("/d/e/f")
    assert fs.listdir("/d") == ["e"]
    fs.crash(random.Random(0))
    assert fs.exists("/d/e/f")  # makedirs is durable on return
    f = fs.open_append("/d/e/f/g")
    f.write(b"abc")
    g = fs.open_append("/d/e/f/g", position=1)
    assert g.tell() == 1
    with pytest.raises(ValueError):
        fs.open_append("/d/e/f/g", position=4)
