"""The `llm-replay` console entry point. It imports nothing heavy at module level, so Ctrl-C or
SIGTERM while the command is still importing (polars, numba: the first second) is one line, not a
traceback or a silent death."""

from __future__ import annotations

import signal
import sys


def _terminated(signum, _frame):
    raise KeyboardInterrupt(signum)


def main(argv: list[str] | None = None) -> int:
    # SIGTERM's default action kills the process silently: until replay.cli.app installs its own
    # handler, it ends the imports as Ctrl-C does (one line, exit 143).
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        from replay.cli.app import main as cli_main
    except KeyboardInterrupt as exc:
        term = bool(exc.args) and exc.args[0] == signal.SIGTERM
        print(f"llm-replay: {'terminated' if term else 'interrupted'}; nothing written", file=sys.stderr)
        return 143 if term else 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
