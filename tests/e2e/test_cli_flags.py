"""Every flag explains itself, and numeric flags have the ranges of their config keys (issue 10)."""

from __future__ import annotations

import argparse

import pytest

from llm_replay.app import build_parser


def _flags(parser: argparse.ArgumentParser, name: str):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                yield from _flags(subparser, f"{name} {sub}")
        elif not isinstance(action, argparse._HelpAction):
            yield name, "/".join(action.option_strings) or action.dest, action


def test_every_flag_of_every_subcommand_has_help():
    flags = list(_flags(build_parser(), "llm-replay"))
    assert len(flags) > 60 and any(cmd == "llm-replay capacity" for cmd, _, _ in flags)
    missing = [f"{cmd} {flag}" for cmd, flag, action in flags if not (action.help or "").strip()]
    assert missing == []


@pytest.mark.parametrize(("flag", "value", "fragment"), [
    ("--flops", "inf", "capacity: --flops: got inf, expected >= 1e+09 and <= 1e+21 (FLOP/s)"),
    ("--flops", "nan", "capacity: --flops: got nan"),
    ("--flops", "-1", "capacity: --flops: got -1"),
    ("--tp", "100000", "capacity: --tp: got 100000, expected >= 1 and <= 512 (GPUs)"),
    ("--gpu-memory-utilization", "nan", "capacity: --gpu-memory-utilization: got nan, expected >= 0 and <= 1 (a share)"),
    ("--num-gpu-blocks-override", "2000000000", "capacity: --num-gpu-blocks-override: got 2000000000, expected >= 1"),
    ("--max-num-batched-tokens", "0", "capacity: --max-num-batched-tokens: got 0"),
    ("--max-num-seqs", "0", "capacity: --max-num-seqs: got 0, expected >= 1"),
    ("--gpu-memory-bytes", "5", "capacity: --gpu-memory-bytes: got 5, expected >= 1e+09 and <= 1e+13 "
                                "(bytes of memory per GPU)"),
    ("--gpu-memory-bytes", "1e14", "capacity: --gpu-memory-bytes: got 1e+14, expected >= 1e+09"),
    ("--gpu-memory-bytes", "nan", "capacity: --gpu-memory-bytes: got nan"),
    ("--gpu-memory-bytes", "-1", "capacity: --gpu-memory-bytes: got -1"),
    ("--gpu-memory-bytes", "80GB", "capacity: argument --gpu-memory-bytes: invalid float value: '80GB'"),
])
def test_capacity_flags_out_of_range_are_one_line(cli, flag, value, fragment):
    argv = ["capacity", "--model", "llama-3.1-8b", "--gpu", "h100-sxm-80gb", flag, value]
    if flag == "--flops":
        argv.append("--break-even")
    res = cli(*argv)
    assert res.code == 2 and res.out == ""
    assert len(res.err.splitlines()) == 1 and res.err.startswith(f"llm-replay: error: {fragment}"), res.err


def test_capacity_flags_in_range_still_work(cli):
    res = cli("capacity", "--model", "llama-3.1-8b", "--break-even", "--flops", "4e14", "--json")
    assert res.code == 0, res.err


@pytest.mark.parametrize("flag", ["--max-memory", "--max-trace-bytes", "--max-line-bytes"])
@pytest.mark.parametrize("value", ["0", "lots", "1e30"])
def test_run_size_flags_that_are_not_a_size_are_one_line(cli, flag, value):
    res = cli("run", flag, value)
    assert res.code == 2 and res.out == "" and len(res.err.splitlines()) == 1, res.err
    assert res.err.startswith(f"llm-replay: error: run: argument {flag}: expected a size in bytes like 3GiB, "
                              f"500MB or 1000000, got {value!r}"), res.err


@pytest.mark.parametrize("value", ["0", "-2", "1.5", "many", "100000"])
def test_run_jobs_that_is_not_a_count_is_one_line(cli, value):
    res = cli("run", "--jobs", value)
    assert res.code == 2 and res.out == "" and len(res.err.splitlines()) == 1, res.err
    assert res.err.startswith("llm-replay: error: run: argument --jobs/-j: expected a whole number of processes "
                              f"from 1 to 1024, got {value!r}"), res.err


def test_the_command_table_is_what_help_lists_and_python_m_runs_it():
    """One row of replay.cli.app.COMMANDS per command once the application registered the
    dashboard's, in the order --help lists them; `python -m llm_replay` (what bench/bench_tui.py
    calls) is the console script."""
    import subprocess
    import sys

    from replay.cli.app import COMMANDS

    (subparsers,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert list(subparsers.choices) == list(COMMANDS) == [
        "run", "capacity", "plan", "sweep", "trace", "synth", "demo", "policies", "catalog", "tui", "calibrate",
        "validate", "profile", "export"]
    done = subprocess.run([sys.executable, "-m", "llm_replay", "--help"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert all(name in done.stdout for name in COMMANDS)
    done = subprocess.run([sys.executable, "-m", "llm_replay", "nope"], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith("llm-replay: error: argument COMMAND: invalid choice")
