"""What --out, --screenshot and --plugin refuse, and what they say (issue 10, items 1 and 5):
a hard link of a run's file is an input like any other, the dashboard never opens a FIFO, the
demo writes only into a new folder or a previous demo's, a user's own live/ is never called ours."""

from __future__ import annotations

import os
import shutil
import threading

from tests.e2e.test_run_dir_safety import FLEET, listing, one_line_error
from tests.tui.conftest import BEFORE


def test_force_refuses_a_run_whose_file_is_the_trace_by_a_hard_link(cli, write, tmp_path):
    write("fleet.yaml", FLEET)
    assert cli("run", "--config", "fleet.yaml", "--out", "d6", "-q").code == 0
    os.link(tmp_path / "d6" / "requests.parquet", tmp_path / "t.parquet")
    before = listing(tmp_path)
    res = cli("run", "t.parquet", "--format", "parquet", "--config", "fleet.yaml", "--out", "d6", "--force", "-q")
    one_line_error(res, "--out d6: holds requests.parquet (an input of this command)")
    assert listing(tmp_path) == before


def test_force_lists_an_input_once(cli, write, tmp_path):
    write("fleet.yaml", FLEET)
    write("data/prod.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n")
    write("data/notes.txt", "mine")
    res = cli("run", "data/prod.csv", "--config", "fleet.yaml", "--out", "data", "--force", "-q")
    err = one_line_error(res, "holds prod.csv (an input of this command), notes.txt;")
    assert err.count("prod.csv") == 1


def test_a_users_own_live_folder_is_not_called_a_replay(cli, write, tmp_path):
    write("fleet.yaml", FLEET)
    write("out/live/mine.txt", "mine")
    before = listing(tmp_path)
    for force in ((), ("--force",)):
        res = cli("run", "--config", "fleet.yaml", "--out", "out", "-q", *force)
        err = one_line_error(res, "out/live exists and is not a live run of llm-replay; choose another --out")
        assert "remove" not in err
    assert listing(tmp_path) == before


def test_demo_force_refuses_a_run_directory_and_a_users_folder(cli, write, tmp_path):
    write("fleet.yaml", FLEET)
    assert cli("run", "--config", "fleet.yaml", "--out", "run", "-q").code == 0
    write("mine/notes.txt", "mine")
    before = listing(tmp_path)
    one_line_error(cli("demo", "incident", "--out", "run", "--force"), "--out run: holds config.yaml",
                   "previous demo's run directories (before/, after/)")
    one_line_error(cli("demo", "incident", "--out", "mine"), "--out mine: already exists")
    one_line_error(cli("demo", "incident", "--out", "mine", "--force"), "--out mine: holds notes.txt")
    assert listing(tmp_path) == before


def test_screenshot_refuses_a_fifo_instead_of_blocking(cli, tmp_path):
    os.mkfifo(tmp_path / "ff.svg")
    result = []
    worker = threading.Thread(target=lambda: result.append(cli("tui", BEFORE, "--screenshot", "ff.svg")),
                              daemon=True)
    worker.start()
    worker.join(60)
    if not result:  # blocked in open(): unblock it with a reader so the test ends
        with open(tmp_path / "ff.svg", "rb") as fh:
            fh.read()
        worker.join(60)
        raise AssertionError("--screenshot blocked on a FIFO")
    one_line_error(result[0], "--screenshot ff.svg: is a FIFO")


def test_dashboard_says_what_a_run_file_is_and_never_opens_a_fifo(cli, tmp_path):
    for make, what in ((os.mkfifo, "is a FIFO"), (os.mkdir, "is a directory"),
                       (lambda p: os.symlink("/dev/zero", p), "is a character device (a symbolic link to /dev/zero)")):
        run = tmp_path / "run"
        shutil.copytree(BEFORE, run)
        (run / "ticks.parquet").unlink()
        make(run / "ticks.parquet")
        one_line_error(cli("tui", "run"), f"run/ticks.parquet: {what}", "not a regular file")
        shutil.rmtree(run)


def test_plugin_that_is_a_fifo_says_so(cli, write, tmp_path):
    write("fleet.yaml", FLEET)
    os.mkfifo(tmp_path / "pl.py")
    res = cli("run", "--config", "fleet.yaml", "--out", "out", "-q", "--plugin", "./pl.py")
    one_line_error(res, "--plugin ./pl.py: is a FIFO")


def test_demo_force_replaces_a_previous_demo(cli, tmp_path):
    assert cli("demo", "incident", "--out", "inc").code == 0
    stamp = (tmp_path / "inc" / "before" / "summary.json").stat().st_mtime_ns
    res = cli("demo", "incident", "--out", "inc", "--force")
    assert res.code == 0, res.err
    assert sorted(p.name for p in (tmp_path / "inc").iterdir()) == ["after", "before"]
    assert (tmp_path / "inc" / "before" / "summary.json").stat().st_mtime_ns != stamp
