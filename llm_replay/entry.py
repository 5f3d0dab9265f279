"""The `llm-replay` console entry point. It imports nothing heavy at module level, so Ctrl-C or
SIGTERM while the command is still importing (polars, numba: the first second) is one line, not a
traceback or a silent death."""

from __future__ import annotations

import os
import signal
import sys

# polars' allocator (jemalloc, configured when polars loads) hands freed pages back after 0.1 s
# rather than ~10 s: a replay builds its tick windows and summary right after freeing large frames,
# and the pages it held on to meanwhile were ~15% of a day's peak RSS (bench/bench_day.py, 4 h:
# 962 -> 780 MB in the tick windows). Not at once: handing back every page as it is freed, and
# faulting it in again for the next batch, cost the m-large day 7 s of its 77 on one core (0 ms
# vs 100 ms: 77.3 vs 70.2 s, 855 vs 876 MB; 4 h on two cores 9.1-9.3 vs 8.4-8.7 s, 680 vs 716 MB).
# A setting of the user's wins.
os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:100,muzzy_decay_ms:100")

# The signal that arrived during the imports, if any.
_received: list[int] = []


def _interrupted(signum, _frame):
    _received.append(signum)
    raise KeyboardInterrupt(signum)


def main(argv: list[str] | None = None) -> int:
    # Until replay.cli.app installs its own handlers, SIGINT and SIGTERM end the imports (SIGTERM's
    # default would kill the process silently) and are remembered: a signal inside a C extension's
    # initialisation (numpy's) can surface as an ImportError that no longer carries it.
    previous = {s: signal.signal(s, _interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        _start_compiling(sys.argv[1:] if argv is None else argv)
        from llm_replay.app import main as cli_main
    except (KeyboardInterrupt, ImportError) as exc:
        if isinstance(exc, ImportError) and not _received:
            raise
        signum = _received[0] if _received else (exc.args[0] if exc.args else signal.SIGINT)
        term = signum == signal.SIGTERM
        print(f"llm-replay: {'terminated' if term else 'interrupted'}; nothing written", file=sys.stderr)
        return 143 if term else 130
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return cli_main(argv)


def _start_compiling(argv: list[str]) -> None:
    """A `run` that may be the first of a fresh install starts the kernels' compile helper now
    (replay/engine/prebuild.py `spawn`: nothing once they are cached, or on one core), so that
    its imports overlap this process's. Not for the reference engine, which compiles nothing,
    nor `--tui`, whose replay runs in a child process of its own."""
    if argv[:1] != ["run"] or {"-h", "--help", "--tui", "--engine=reference"} & set(argv):
        return
    if any(a == "--engine" and b == "reference" for a, b in zip(argv, argv[1:])):
        return
    from replay.engine import prebuild

    prebuild.spawn()


if __name__ == "__main__":
    sys.exit(main())
