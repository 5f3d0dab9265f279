"""What every command's parser shares: one-line usage errors and the --plugin option."""

from __future__ import annotations

import argparse

EXIT_USAGE = 2


class OneLineParser(argparse.ArgumentParser):
    """A usage mistake is one line, as every other user mistake is: `llm-replay: error: run:
    MESSAGE (see llm-replay run --help)` and exit 2, not argparse's whole usage block."""

    def error(self, message: str):
        command = self.prog.removeprefix("llm-replay").strip()
        flag = message.removeprefix("argument ").partition(":")[0] if message.endswith(": expected one argument") else ""
        if flag.startswith("--"):  # argparse reads '-5:' as an option: the value must be joined to its flag
            example = "--window=-5:" if flag == "--window" else f"{flag}=VALUE"
            message += f" (a value that starts with '-' goes after '=': {example})"
        where = f"{command}: " if command else ""
        self.exit(EXIT_USAGE, f"llm-replay: error: {where}{message} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):
        # argparse reports a subcommand's unknown flags from the top parser: name the subcommand
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            path = [getattr(namespace, d, None) for d in ("command", "trace_command", "demo_command")]
            parser = OneLineParser(prog=" ".join([self.prog, *filter(None, path)]), add_help=False)
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace


def add_plugin_option(p: argparse.ArgumentParser, extra: str = "") -> None:
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                   help="allow a config's 'MODULE:function' policies to load this module (a module on the "
                        "Python path, or a .py file); a config alone never imports code (repeatable)"
                        + (f"; {extra}" if extra else ""))
