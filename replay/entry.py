"""The `llm-replay` console entry point. It imports nothing at module level, so Ctrl-C while the
command is still importing (polars, numba: the first 0.3 s and more) is one line, not a traceback."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    try:
        from replay.cli import main as cli_main
    except KeyboardInterrupt:
        print("llm-replay: interrupted; nothing written", file=sys.stderr)
        return 130
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
