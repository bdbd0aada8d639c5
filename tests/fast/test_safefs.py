"""safefs reads refuse what is not a regular file with a clear error (never an internal one)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from coxswain import safefs
from coxswain.errors import CoxError


def test_reading_a_folder_is_a_clear_refusal(tmp_path: Path) -> None:
    """A command can turn a file into a folder; the versions service then reads the path and got
    IsADirectoryError (an internal error in versions.after) instead of "is a folder"."""
    (tmp_path / "was-a-file").mkdir()
    with pytest.raises(CoxError, match="is a folder"):
        safefs.read(tmp_path, "was-a-file")


def test_reading_a_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(CoxError, match="not a regular file"):
        safefs.read(tmp_path, "pipe")


def test_a_missing_file_reads_as_none(tmp_path: Path) -> None:
    assert safefs.read(tmp_path, "nothing-here") is None
