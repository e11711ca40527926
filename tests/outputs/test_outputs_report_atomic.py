"""report.html goes through the one atomic writer: replaced whole, never half-written, OS errors as one line."""

from __future__ import annotations

import os

import pytest

from spatialfed.errors import OutputError
from spatialfed.outputs.monitor import FitMonitor


def test_report_is_written_atomically_and_failures_leave_the_old_one(tmp_path):
    mon = FitMonitor(2)
    path = mon.write_report(tmp_path / "report.html")
    old = path.read_text()
    assert old.startswith("<!DOCTYPE html>") and os.listdir(tmp_path) == ["report.html"]

    # a page that fails half-way through the write (the staged file exists when it fails): a lone surrogate in
    # the title cannot be encoded as UTF-8
    with pytest.raises(UnicodeEncodeError):
        mon.write_report(path, title="fit \udc80")
    assert path.read_text() == old and os.listdir(tmp_path) == ["report.html"]


def test_report_path_errors_are_one_line(tmp_path):
    (tmp_path / "report.html").mkdir()
    (tmp_path / "afile").write_text("x")
    mon = FitMonitor(2)
    with pytest.raises(OutputError, match=r"report.html: it exists and is a directory"):
        mon.write_report(tmp_path / "report.html")
    with pytest.raises(OutputError, match="is a file, not a directory"):
        mon.write_report(tmp_path / "afile" / "report.html")
    assert sorted(os.listdir(tmp_path)) == ["afile", "report.html"]
