"""spatialfed.atomic: the one atomic-write routine (staged sibling, rename into place, clean-up, one-line errors)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from spatialfed import atomic
from spatialfed.atomic import replace_path, staged, write_atomic, write_bytes, write_text
from spatialfed.errors import OutputError, SpatialFedError


def listing(d: Path) -> list[str]:
    return sorted(os.listdir(d))


def test_file_is_staged_beside_the_target_with_its_suffix_and_renamed(tmp_path):
    target = tmp_path / "out" / "pred.csv"
    seen = []
    with staged(target) as tmp:
        seen.append(tmp)
        assert tmp.parent == target.parent and tmp.suffix == ".csv" and tmp.name.startswith(".pred.tmp-")
        assert not target.exists()
        tmp.write_text("a\n")
    assert target.read_text() == "a\n" and not seen[0].exists()
    write_text(target, "b\n")  # replaces
    assert target.read_text() == "b\n" and listing(target.parent) == ["pred.csv"]
    assert write_bytes(tmp_path / "x.bin", b"\x00\x01").read_bytes() == b"\x00\x01"
    assert write_atomic(tmp_path / "y.txt", lambda p: Path(p).write_text("y")).read_text() == "y"


def test_directory_is_staged_then_replaces_the_old_one(tmp_path):
    target = tmp_path / "store.zarr"
    with staged(target, directory=True) as tmp:
        assert tmp.is_dir() and not any(tmp.iterdir())
        (tmp / "a").write_text("1")
    assert (target / "a").read_text() == "1"
    with staged(target, directory=True) as tmp:
        (tmp / "b").write_text("2")
    assert listing(target) == ["b"]  # the old tree is gone, not merged
    assert listing(tmp_path) == ["store.zarr"]  # no temporary, no moved-aside copy


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_failure_leaves_the_old_output_and_no_temporary(tmp_path, exc):
    write_text(tmp_path / "f.json", "old")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "keep").write_text("old")
    with pytest.raises(type(exc)):
        with staged(tmp_path / "f.json") as tmp:
            tmp.write_text("partial")
            raise exc
    with pytest.raises(type(exc)):
        with staged(tmp_path / "d", directory=True) as tmp:
            (tmp / "half").write_text("partial")
            raise exc
    assert (tmp_path / "f.json").read_text() == "old" and listing(tmp_path / "d") == ["keep"]
    assert listing(tmp_path) == ["d", "f.json"]


def test_a_failed_rename_keeps_the_old_directory(tmp_path, monkeypatch):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "keep").write_text("old")
    real = os.replace

    def fail_into_place(src, dst):
        if Path(dst) == tmp_path / "d" and ".tmp-" in Path(src).name:
            raise OSError(errno.EIO, "Input/output error")
        return real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", fail_into_place)
    with pytest.raises(OutputError, match=r"cannot write .*d: Input/output error"):
        with staged(tmp_path / "d", directory=True) as tmp:
            (tmp / "new").write_text("new")
    assert listing(tmp_path) == ["d"] and listing(tmp_path / "d") == ["keep"]


def test_nothing_written_is_an_error(tmp_path):
    with pytest.raises(OutputError, match="nothing was written"):
        with staged(tmp_path / "f.txt"):
            pass
    assert listing(tmp_path) == []


def test_os_errors_become_one_line_naming_the_path_and_the_fix(tmp_path):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    cases = [
        (lambda: staged(tmp_path / "afile", directory=True), "exists and is a file"),
        (lambda: staged(tmp_path / "adir"), "exists and is a directory"),
        (lambda: staged(tmp_path / "afile" / "sub" / "x.txt"), "is a file, not a directory"),
        (lambda: staged(tmp_path / "afile" / "x.txt"), "not a directory"),
        (lambda: staged(tmp_path / "missing" / "x.txt", make_parents=False), "does not exist; create it first"),
    ]
    for make, message in cases:
        with pytest.raises(OutputError, match=message) as info:
            with make() as tmp:
                tmp.write_text("x")
        text = str(info.value)
        assert "\n" not in text and text.startswith("cannot write ") and isinstance(info.value, SpatialFedError)
    assert listing(tmp_path) == ["adir", "afile"]


def test_no_space_and_read_only_name_the_cause(tmp_path):
    def fill_device(_tmp):  # a real ENOSPC from the kernel: /dev/full refuses every write
        with open("/dev/full", "wb") as fh:
            fh.write(b"x" * 4096)
            fh.flush()

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    with pytest.raises(OutputError, match=r"pred.csv: no space left on the device; free some space"):
        write_atomic(tmp_path / "pred.csv", fill_device)

    def read_only(tmp):
        raise OSError(errno.EROFS, "Read-only file system", tmp)

    with pytest.raises(OutputError, match="read-only; choose an output path on a writable disk"):
        write_atomic(tmp_path / "pred.csv", read_only)
    assert listing(tmp_path) == []


def test_replace_path_refuses_a_kind_change(tmp_path):
    (tmp_path / "f").write_text("x")
    (tmp_path / "d").mkdir()
    (tmp_path / "src_dir").mkdir()
    (tmp_path / "src_file").write_text("y")
    with pytest.raises(OutputError, match="is a file"):
        replace_path(tmp_path / "src_dir", tmp_path / "f")
    with pytest.raises(OutputError, match="is a directory"):
        replace_path(tmp_path / "src_file", tmp_path / "d")
