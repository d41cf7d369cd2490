"""Owner-only data directories and the start-up check of key-bearing files."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from service.common.errors import InvalidArgument
from service.common.private_files import (
    OWNER_ONLY_UMASK,
    check_private_tree,
    owner_only_umask,
    private_dir,
)


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_private_dir_creates_owner_only_and_tightens_an_open_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    new = private_dir(tmp_path / "a" / "b")
    assert mode(new) == 0o700
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o755)
    with caplog.at_level(logging.WARNING):
        private_dir(loose)
    assert mode(loose) == 0o700
    assert str(loose) in caplog.text and "0755" in caplog.text


def test_check_private_tree_refuses_a_readable_file_naming_it(tmp_path: Path) -> None:
    root = tmp_path / "raft"
    (root / "wal").mkdir(parents=True, mode=0o700)
    os.chmod(root, 0o700)
    os.chmod(root / "wal", 0o700)
    seg = root / "wal" / "wal-000001"
    seg.write_bytes(b"x")
    os.chmod(seg, 0o600)
    check_private_tree(root, "keys")  # all owner-only: fine
    check_private_tree(tmp_path / "missing", "keys")  # nothing there yet: fine
    os.chmod(seg, 0o644)
    with pytest.raises(InvalidArgument, match=r"wal-000001 holds keys .*0644.*chmod -R go-rwx"):
        check_private_tree(root, "keys")
    os.chmod(seg, 0o600)
    os.chmod(root / "wal", 0o750)
    with pytest.raises(InvalidArgument, match=r"wal holds keys"):
        check_private_tree(root, "keys")


def test_umask_makes_new_files_owner_only(tmp_path: Path) -> None:
    before = owner_only_umask()
    try:
        (tmp_path / "f").write_text("secret")
        (tmp_path / "d").mkdir()
        assert mode(tmp_path / "f") == 0o600
        assert mode(tmp_path / "d") == 0o700
        assert os.umask(OWNER_ONLY_UMASK) == OWNER_ONLY_UMASK
    finally:
        os.umask(before)
