"""A run directory is never lost: --force replaces only a run, the swap is one step, one writer at
a time, dead writers' leftovers go, a full disk keeps the old run, signals end cleanly (issue 10,
items 1-4)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from replay.outputs.rundir import locked, writer_tag
from tests.e2e.conftest import RUN_FILES, small_fleet

FLEET = small_fleet("{path: azure-code-2023, window: {end_s: 20}}")
# Slow enough (pure-Python engine, 20 minutes of arrivals) that a signal lands mid-replay.
SLOW = small_fleet("{path: azure-conv-2023, window: {end_s: 1200}}")


def listing(root: Path) -> dict[str, bytes | None]:
    """Every path under root, with the bytes of each file."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def said(err: str) -> str:
    """stderr without the trace's notes (rows the window dropped)."""
    return "".join(line for line in err.splitlines(keepends=True) if not line.startswith("note: "))


def one_line_error(res, *fragments: str) -> str:
    err = said(res.err)
    assert res.code == 2, (res.code, res.err)
    assert "Traceback" not in err and len(err.splitlines()) == 1, res.err
    assert err.startswith("llm-replay: error: "), res.err
    for fragment in fragments:
        assert fragment in err, (fragment, res.err)
    return err


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


@pytest.fixture
def old_run(cli, write, tmp_path) -> Path:
    write("fleet.yaml", FLEET)
    res = cli("run", "--config", "fleet.yaml", "--out", "out", "-q")
    assert res.code == 0, res.err
    return tmp_path / "out"


# --- 1: --force replaces a run directory, nothing else -------------------------------------------


def test_force_refuses_a_folder_holding_the_trace_and_notes(cli, write, tmp_path):
    write("fleet.yaml", FLEET)
    write("data/trace.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n")
    write("data/notes.txt", "my notes")
    before = listing(tmp_path)
    res = cli("run", "data/trace.csv", "--config", "fleet.yaml", "--out", "data", "--force", "-q")
    one_line_error(res, "--out data", "notes.txt", "trace.csv (an input of this command)", "--force replaces only")
    assert listing(tmp_path) == before


def test_force_refuses_a_run_directory_holding_the_config_it_replays(cli, old_run, tmp_path):
    before = listing(tmp_path)
    res = cli("run", "--config", "out/config.yaml", "--out", "out", "--force", "-q")
    one_line_error(res, "--out out", "config.yaml (an input of this command)")
    assert listing(tmp_path) == before


def test_force_refuses_a_subfolder_and_replaces_a_run(cli, old_run, tmp_path):
    (old_run / "plots").mkdir()
    res = cli("run", "--config", "fleet.yaml", "--out", "out", "--force", "-q")
    one_line_error(res, "plots/")
    (old_run / "plots").rmdir()
    (old_run / "summary.json").write_text("{}")
    res = cli("run", "--config", "fleet.yaml", "--out", "out", "--force", "-q")
    assert res.code == 0, res.err
    assert {p.name for p in old_run.iterdir()} == RUN_FILES and json.loads((old_run / "summary.json").read_text())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet.yaml", "out"]  # no temp dir, no lock file


def test_demo_force_refuses_what_is_not_a_run(cli, write, tmp_path):
    write("inc/before/notes.txt", "keep")
    before = listing(tmp_path)
    one_line_error(cli("demo", "incident", "--out", "inc", "--force"), "inc/before", "notes.txt")
    assert listing(tmp_path) == before


def test_run_tui_force_refuses_what_is_not_a_run(cli, write, tmp_path):
    write("fleet.yaml", FLEET)
    write("out/notes.txt", "keep")
    before = listing(tmp_path)
    one_line_error(cli("run", "--config", "fleet.yaml", "--out", "out", "--force", "--tui"), "notes.txt")
    assert listing(tmp_path) == before


# --- 2: one-step swap; signals ---------------------------------------------------------------------


def test_a_signal_during_the_swap_waits_for_it(cli, old_run, tmp_path, monkeypatch):
    """Ctrl-C as the new run is swapped in: the swap and the old run's removal finish, and the
    message says the run was written (today: "nothing written" while the old run sat aside)."""
    import replay.outputs.write as outputs

    real = outputs.exchange

    def interrupted_exchange(a, b):
        signal.raise_signal(signal.SIGINT)
        return real(a, b)

    monkeypatch.setattr(outputs, "exchange", interrupted_exchange)
    (old_run / "summary.json").write_text("{}")
    res = cli("run", "--config", "fleet.yaml", "--out", "out", "--force", "-q")
    assert res.code == 130 and said(res.err) == "llm-replay: interrupted; the run was written to out\n", res.err
    assert {p.name for p in old_run.iterdir()} == RUN_FILES and json.loads((old_run / "summary.json").read_text())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet.yaml", "out"]


def test_without_renameat2_two_renames_replace_the_run(cli, old_run, tmp_path, monkeypatch):
    import replay.outputs.write as outputs

    monkeypatch.setattr(outputs, "exchange", lambda a, b: False)
    (old_run / "summary.json").write_text("{}")
    res = cli("run", "--config", "fleet.yaml", "--out", "out", "--force", "-q")
    assert res.code == 0, res.err
    assert json.loads((old_run / "summary.json").read_text())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet.yaml", "out"]


def test_an_old_run_left_aside_by_a_dead_writer_is_put_back(cli, old_run, tmp_path):
    """The fallback's two renames, killed between them: the next start puts the old run back."""
    kept = listing(old_run)
    aside = tmp_path / f".out.old-{dead_pid()}-1-x7q2"
    aside.mkdir()
    old_run.rename(aside / "run")
    res = cli("run", "--config", "fleet.yaml", "--out", "out", "-q")
    one_line_error(res, "already exists")  # the old run is back, and not replaced without --force
    assert listing(old_run) == kept and not aside.exists()


def _start_slow_run(tmp_path: Path, *extra: str) -> subprocess.Popen:
    """`llm-replay run` (the console entry point) in a child process, once it holds --out's lock
    (taken before the replay starts)."""
    (tmp_path / "slow.yaml").write_text(SLOW)
    proc = subprocess.Popen([sys.executable, "-m", "llm_replay.entry", "run", "--config", "slow.yaml", "--out", "out",
                             "--engine", "reference", "-q", *extra], cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (tmp_path / ".out.lock").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
        time.sleep(0.02)
    time.sleep(0.3)
    return proc


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_the_replay_keeps_the_old_run(old_run, tmp_path, signum):
    kept = listing(old_run)
    proc = _start_slow_run(tmp_path, "--force")
    proc.send_signal(signum)
    err = proc.communicate(timeout=60)[1]
    word = "terminated" if signum == signal.SIGTERM else "interrupted"
    assert proc.returncode == 128 + signum and said(err) == f"llm-replay: {word}; nothing written\n", err
    assert listing(old_run) == kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet.yaml", "out", "slow.yaml"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_whose_exception_numba_swallowed_still_stops_the_run(cli, old_run, monkeypatch, signum):
    """Numba loads its kernels inside llvmlite's ctypes callbacks, which print and drop an
    exception raised there: the signal that came then must still stop the run before it writes."""
    import replay.outputs.report
    from replay.outputs.rundir import raise_interrupted

    def loading_swallows_the_signal(console, **_kw):
        try:
            raise_interrupted(signum, None)  # what the handler does, inside a callback that drops it
        except BaseException:  # noqa: BLE001 - the ctypes callback's behaviour, reproduced
            pass

    kept = listing(old_run)
    with monkeypatch.context() as patch:
        patch.setattr(replay.outputs.report, "engine_ready", loading_swallows_the_signal)
        res = cli("run", "--config", "fleet.yaml", "--out", "out", "--force", "-q")
    word = "terminated" if signum == signal.SIGTERM else "interrupted"
    assert res.code == 128 + signum and said(res.err) == f"llm-replay: {word}; nothing written\n", res.err
    assert listing(old_run) == kept
    assert cli("run", "--config", "fleet.yaml", "--out", "again", "-q").code == 0  # the next command starts clean


@pytest.mark.parametrize("signum, code, word", [(signal.SIGINT, 130, "interrupted"),
                                                (signal.SIGTERM, 143, "terminated")])
def test_a_signal_while_importing_is_one_line(tmp_path, signum, code, word):
    """SIGINT or SIGTERM as soon as the interpreter runs the entry point, while it still imports
    polars, numba and the rest: one line and 130 / 143, never a traceback or a silent death."""
    script = ("import sys; print('up', flush=True); from llm_replay.entry import main; "
              "sys.exit(main(['run', '--out', 'out', '-q']))")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "up\n"
    time.sleep(0.05)
    proc.send_signal(signum)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == code and err == f"llm-replay: {word}; nothing written\n", err
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_inside_an_import_of_the_entry_point(monkeypatch, capsys):
    """The same, deterministic: KeyboardInterrupt raised by the import of replay.cli.app itself
    (which the application's llm_replay.app imports)."""
    import llm_replay.app
    import llm_replay.entry

    class Interrupting:
        def find_spec(self, name, path=None, target=None):
            if name == "replay.cli.app":
                raise KeyboardInterrupt
            return None

    monkeypatch.delitem(sys.modules, "llm_replay.app")
    monkeypatch.delitem(sys.modules, "replay.cli.app")
    monkeypatch.setattr(sys, "meta_path", [Interrupting(), *sys.meta_path])
    assert llm_replay.entry.main(["catalog"]) == 130
    assert capsys.readouterr().err == "llm-replay: interrupted; nothing written\n"


# --- 3: one writer per run directory -------------------------------------------------------------


def test_a_second_writer_is_refused(cli, old_run, tmp_path):
    kept = listing(old_run)
    with locked(Path("out")):  # another llm-replay writing out/
        res = cli("run", "--config", "fleet.yaml", "--out", "out", "--force", "-q")
        one_line_error(res, "--out", "another llm-replay", f"pid {os.getpid()}", "is writing this run directory")
    assert listing(old_run) == kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet.yaml", "out"]


def test_a_second_writer_of_a_new_directory_is_refused_and_leaves_nothing(cli, write, tmp_path):
    write("fleet.yaml", FLEET)
    with locked(Path("runs/new")):
        one_line_error(cli("run", "--config", "fleet.yaml", "--out", "runs/new", "-q"), "another llm-replay")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet.yaml"]  # runs/ made for the lock is gone


def test_a_second_process_is_refused_while_the_first_writes(cli, old_run, tmp_path):
    proc = _start_slow_run(tmp_path, "--force")
    try:
        res = cli("run", "--config", "fleet.yaml", "--out", "out", "--force", "-q")
        one_line_error(res, "another llm-replay", f"pid {proc.pid}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert cli("run", "--config", "fleet.yaml", "--out", "out", "--force", "-q").code == 0


# --- 4: nothing left behind ----------------------------------------------------------------------


def test_dead_writers_temp_dirs_are_removed_and_only_those(cli, old_run, tmp_path):
    dead = dead_pid()
    me = "-".join(map(str, writer_tag()))
    leftovers = {
        f".out.tmp-{dead}-1-ab12": False,  # a dead writer's: removed
        f".out.tmp-{me}-cd34": True,  # a live writer's (this process): kept
        ".out.tmp-ef56": True,  # no writer recorded: kept
        f".other.tmp-{dead}-1-gh78": True,  # beside another --out: kept
    }
    for name in leftovers:
        (tmp_path / name).mkdir()
        (tmp_path / name / "ticks.parquet").write_text("partial")
    res = cli("run", "--config", "fleet.yaml", "--out", "out", "--force", "-q")
    assert res.code == 0, res.err
    assert {name: (tmp_path / name).exists() for name in leftovers} == leftovers


def test_a_dead_run_tui_live_dir_is_removed_and_a_live_one_refused(cli, old_run, tmp_path):
    live = old_run / "live"
    live.mkdir()
    status = {"state": "running", "seq": 3, "done_us": 5, "end_us": 50}
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        pid, start = writer_tag(sleeper.pid)
        (live / "status.json").write_text(json.dumps(status | {"pid": pid, "pid_start": start}))
        res = cli("run", "--config", "fleet.yaml", "--out", "out", "--force", "-q")
        one_line_error(res, f"a replay (pid {pid}) is writing it")
    finally:
        sleeper.kill()
        sleeper.wait()
    res = cli("run", "--config", "fleet.yaml", "--out", "out", "--force", "-q")  # its writer is dead now
    assert res.code == 0, res.err
    assert {p.name for p in old_run.iterdir()} == RUN_FILES


def test_the_dashboard_tells_a_dead_writer_from_a_slow_one(tmp_path):
    from tests.tui.test_live import live_until
    from tui.data import LiveFollower

    out = tmp_path / "run"
    live_until(out, 5)
    follower = LiveFollower(out)  # the writer (this process) is alive: a slow run, still followed
    assert follower.data.live.state == "running" and follower.poll() is None
    status = out / "live" / "status.json"
    status.write_text(json.dumps(json.loads(status.read_text()) | {"pid": dead_pid()}))
    gone = follower.poll()
    assert gone.live.state == "failed" and gone.live.error.startswith("writer exited")
    assert gone.end_us == follower.data.end_us == 5_000_000  # shown as far as it was written
    assert follower.poll() is None


def test_a_full_disk_is_one_line_and_keeps_the_old_run(cli, old_run, tmp_path, monkeypatch):
    import replay.outputs.write as outputs

    real = outputs._write_files

    def full_disk(tmp, run):
        real(tmp, run)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(outputs, "_write_files", full_disk)
    kept = listing(tmp_path)
    res = cli("run", "--config", "fleet.yaml", "--out", "out", "--force", "-q")
    one_line_error(res, "--out out", "No space left on device (ENOSPC)", "the old run is kept")
    assert listing(tmp_path) == kept
    shutil.rmtree(old_run)
    res = cli("run", "--config", "fleet.yaml", "--out", "out", "-q")
    one_line_error(res, "nothing written")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet.yaml"]


def test_run_tui_whose_replay_is_killed_closes_and_leaves_nothing(cli, write, tmp_path, monkeypatch):
    """The replay process killed (SIGKILL: no failure recorded): the dashboard sees its writer
    dead, says so and closes by itself (it used to show "live 0% following" forever)."""
    import asyncio

    from tui.app import Dashboard

    write("fleet.yaml", FLEET)
    seen = {}

    def run(self):
        async def go():
            async with self.run_test(size=(100, 30)) as pilot:
                status = json.loads((tmp_path / "out" / "live" / "status.json").read_text())
                os.kill(status["pid"], signal.SIGKILL)
                for _ in range(600):
                    await pilot.pause(0.1)
                    if not self.is_running:
                        break
                live = self.model.runs[0].live
                seen["error"] = live.error if live is not None else None
                seen["closed_by_itself"] = not self.is_running
                if self.is_running:
                    await pilot.press("q")

        asyncio.run(go())

    monkeypatch.setattr(Dashboard, "run", run)
    res = cli("run", "--config", "fleet.yaml", "--out", "out", "--tui")
    assert seen["closed_by_itself"] and seen["error"].startswith("writer exited"), seen
    assert res.code == 1 and "nothing written" in res.err and "Traceback" not in res.err, res.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet.yaml"]
