"""A run killed (SIGKILL, no chance to clean up) or out of disk in the middle of writing its files
leaves no partial run directory: the old run stays, what the writer left beside it is removed by
the next run and nothing of the user's is touched (issue 15, "Bad input")."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl

from tests.e2e.conftest import small_fleet
from tests.e2e.test_run_dir_safety import FLEET, listing, one_line_error

ROOT = Path(__file__).resolve().parents[2]


def test_a_disk_that_fills_inside_requests_parquet_keeps_the_old_run(cli, write, tmp_path, monkeypatch):
    import replay.outputs.write as outputs

    write("fleet.yaml", FLEET)
    assert cli("run", "--config", "fleet.yaml", "--out", "out", "-q").code == 0
    kept = listing(tmp_path)
    real_open = open
    written = {}

    class Filling:
        """A file that takes 1,000 bytes, then reports a full disk."""

        def __init__(self, path, mode):
            self.fh, self.name = real_open(path, mode), Path(path).name

        def write(self, data):
            written[self.name] = written.get(self.name, 0) + len(data)
            if written[self.name] > 1000:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self.fh.write(data)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

    monkeypatch.setattr(outputs, "open", Filling, raising=False)
    res = cli("run", "--config", "fleet.yaml", "--out", "out", "--force", "-q")
    one_line_error(res, "--out out", "cannot write the run: No space left on device (ENOSPC)", "the old run is kept")
    assert list(written) == ["requests.parquet"]  # it failed inside the first file, not after it
    assert listing(tmp_path) == kept


KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys
    import replay.outputs.write as outputs
    from llm_replay.app import main

    real = outputs.write_parquet
    def killed(frame, path, metadata):
        real(frame, path, metadata)  # requests.parquet written, the rest not
        os.kill(os.getpid(), signal.SIGKILL)
    outputs.write_parquet = killed
    sys.exit(main(sys.argv[1:]))
""")


def test_a_writer_killed_mid_write_leaves_no_run_and_the_next_run_cleans_up(write, tmp_path, cli):
    write("fleet.yaml", FLEET)
    write(".out.tmp-notes/mine.txt", "the user's, named like a leftover but without a writer")
    write("out.notes.txt", "the user's")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", KILLED_WRITER, "run", "--config", "fleet.yaml", "--out", "out",
                           "-q"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert not (tmp_path / "out").exists()
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.tmp-") and p.name != ".out.tmp-notes"]
    assert len(left) == 1 and (tmp_path / left[0] / "requests.parquet").is_file()  # what it had written
    res = cli("run", "--config", "fleet.yaml", "--out", "out", "-q")
    assert res.code == 0, res.err
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [".out.tmp-notes", "fleet.yaml", "out", "out.notes.txt"], names
    assert (tmp_path / ".out.tmp-notes" / "mine.txt").read_text().startswith("the user's")
    assert pl.read_parquet(tmp_path / "out" / "requests.parquet").height > 0


def test_a_replay_killed_before_the_write_leaves_no_run(write, tmp_path, cli):
    write("fleet.yaml", small_fleet("{path: azure-code-2023, window: {end_s: 20}}"))
    script = KILLED_WRITER.replace("real(frame, path, metadata)  # requests.parquet written, the rest not", "pass")
    script = script.replace("outputs.write_parquet = killed",
                            "import replay.run as run\nrun.summarize = lambda *a: killed(None, None, None)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script, "run", "--config", "fleet.yaml", "--out", "out", "-q"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == -signal.SIGKILL, done.stderr
    # no run directory and no temp one (the lock file of the dead writer may stay; the next run reuses it)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != ".out.lock") == ["fleet.yaml"]
    assert cli("run", "--config", "fleet.yaml", "--out", "out", "-q").code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet.yaml", "out"]


def test_a_replay_killed_after_its_rows_spilled_leaves_no_run_and_the_next_run_cleans_up(write, tmp_path, cli):
    """A large run's request rows go to requests.parquet beside --out while it replays
    (replay/outputs/rows.py); killed before the write, that file is all it leaves, and the next
    run on the same --out removes them."""
    write("fleet.yaml", small_fleet("{path: azure-code-2023, window: {end_s: 20}}"))
    script = KILLED_WRITER.replace("outputs.write_parquet = killed",
                                   "import replay.outputs.rows as rows\nrows.MEMORY_ROWS = 10\n"
                                   "outputs.write_run = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script, "run", "--config", "fleet.yaml", "--out", "out", "-q"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == -signal.SIGKILL, done.stderr
    left = [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp-")]
    assert len(left) == 1 and "-rows-" in left[0].name and len(list(left[0].glob("*.parquet"))) >= 1
    assert not (tmp_path / "out").exists()
    assert cli("run", "--config", "fleet.yaml", "--out", "out", "-q").code == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != ".out.lock") == ["fleet.yaml", "out"]
