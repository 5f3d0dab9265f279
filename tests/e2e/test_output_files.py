"""A user-named output file (calibrate's profile, profile's CSV, the dashboard's screenshot) never
replaces an input of the command, a FIFO, a device, a link or a directory, never an existing file
without --force, and never creates a directory (issue 10, item 1: files are never lost)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e.conftest import FIXTURES
from tests.e2e.test_run_dir_safety import listing, one_line_error

SPLITWISE = FIXTURES.parent / "profiles" / "splitwise" / "perf_model.csv"
CALIBRATE = ("calibrate", "--model", "llama-2-70b", "--gpu", "h100-sxm-80gb", "--tp", "4")


@pytest.fixture
def profile_csv(tmp_path) -> Path:
    copy = tmp_path / "p.csv"
    copy.write_bytes(SPLITWISE.read_bytes())
    return copy


def test_calibrate_refuses_its_own_input_even_with_force(cli, profile_csv, tmp_path):
    os.link(profile_csv, tmp_path / "hard.csv")
    os.symlink("p.csv", tmp_path / "soft.csv")
    before = listing(tmp_path)
    for out in ("p.csv", str(profile_csv), "hard.csv"):
        res = cli(*CALIBRATE, "p.csv", "--out", out, "--force")
        one_line_error(res, f"--out {out}: is p.csv, an input of this command")
    one_line_error(cli(*CALIBRATE, "p.csv", "--out", "soft.csv", "--force"), "--out soft.csv: is a symbolic link")
    assert listing(tmp_path) == before


def test_calibrate_refuses_what_is_not_a_regular_file(cli, profile_csv, tmp_path):
    os.mkfifo(tmp_path / "ff.yaml")
    (tmp_path / "dir").mkdir()
    before = listing(tmp_path)
    for out, what in (("ff.yaml", "is a FIFO"), ("dir", "is a directory"), ("/dev/full", "is a character device"),
                      ("/nonexist/x.yaml", "directory /nonexist does not exist"),
                      ("sub/x.yaml", f"directory {tmp_path / 'sub'} does not exist")):
        one_line_error(cli(*CALIBRATE, "p.csv", "--out", out, "--force"), f"--out {out}: {what}")
    assert listing(tmp_path) == before and not os.path.exists("/nonexist")
    assert (tmp_path / "ff.yaml").is_fifo()


def test_calibrate_replaces_an_existing_file_only_with_force(cli, profile_csv, tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("my own notes\n")
    one_line_error(cli(*CALIBRATE, "p.csv", "--out", "mine.yaml"), "--out mine.yaml: already exists", "--force")
    assert mine.read_text() == "my own notes\n"
    res = cli(*CALIBRATE, "p.csv", "--out", "mine.yaml", "--force")
    assert res.code == 0, res.err
    assert "llama-2-70b" in mine.read_text() and profile_csv.read_bytes() == SPLITWISE.read_bytes()


def test_profile_checks_its_out_before_timing_anything(cli, tmp_path):
    (tmp_path / "old.csv").write_text("keep\n")
    os.mkfifo(tmp_path / "ff.csv")
    before = listing(tmp_path)
    argv = ("profile", "--model", "llama-3.1-8b", "--gpu-name", "x", "--device", "cpu", "--tiny", "--out")
    one_line_error(cli(*argv, "old.csv"), "--out old.csv: already exists", "--force")
    one_line_error(cli(*argv, "ff.csv", "--force"), "--out ff.csv: is a FIFO")
    one_line_error(cli(*argv, "no/x.csv"), f"directory {tmp_path / 'no'} does not exist")
    assert listing(tmp_path) == before
