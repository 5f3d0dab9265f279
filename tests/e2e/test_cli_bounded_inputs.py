"""Inputs that used to hang, exhaust memory or do nothing silently, through the CLI.

Every refusal is exit 2, one `llm-replay: error:` line naming the file and the flag that
changes the bound, no traceback and no run directory; every doubt is a `warning:` line.
"""

from __future__ import annotations

import gzip
import json
import os
import signal

import pytest

from tests.e2e.conftest import small_fleet


@pytest.fixture
def deadline():
    """A hang (a FIFO nobody writes) fails the test instead of stopping the suite."""

    def expired(*_):
        raise AssertionError("still running after 60 s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def refused(res, *fragments: str) -> str:
    assert res.code == 2, res.err
    assert res.err.startswith("llm-replay: error: ") and res.err.count("\n") == 1, res.err
    assert "Traceback" not in res.err
    for fragment in fragments:
        assert fragment in res.err, res.err
    return res.err


@pytest.mark.usefixtures("deadline")
def test_a_fifo_trace_is_refused(cli, tmp_path):
    os.mkfifo("pipe.csv")
    refused(cli("run", "pipe.csv", "--out", "r"), "pipe.csv: is a FIFO (named pipe), not a regular file")
    assert not (tmp_path / "r").exists()


@pytest.mark.usefixtures("deadline")
def test_dev_zero_through_a_config_trace_section_is_refused(cli, write):
    write("fleet.yaml", small_fleet("{path: /dev/zero}"))
    refused(cli("trace", "inspect", "--config", "fleet.yaml"), "/dev/zero: is a character device")


@pytest.mark.usefixtures("deadline")
def test_a_fifo_step_model_table_is_refused(cli, write):
    os.mkfifo("steps.csv")
    write("fleet.yaml", "model: llama-3.1-8b\ngpu: h100-sxm-80gb\n"
                        "pools:\n  - {replicas: 1, step_model: {backend: table, table: steps.csv}}\n")
    refused(cli("run", "--config", "fleet.yaml", "--out", "r"), "pools[0].step_model.table",
            "steps.csv: is a FIFO (named pipe), not a regular file (expected a table file)")


@pytest.mark.usefixtures("deadline")
def test_a_fifo_step_model_profile_is_refused(cli, write):
    os.mkfifo("fit.yaml")
    write("fleet.yaml", "model: llama-3.1-8b\ngpu: h100-sxm-80gb\n"
                        "pools:\n  - {replicas: 1, step_model: {profile: fit.yaml}}\n")
    refused(cli("run", "--config", "fleet.yaml", "--out", "r"), "fit.yaml: is a FIFO (named pipe)")


def test_a_gzip_bomb_is_refused_at_the_bound_the_flag_sets(cli, write):
    write("bomb.csv.gz", gzip.compress(b"ts,p,o\n" + b"\n" * (4 << 20)))
    refused(cli("trace", "inspect", "bomb.csv.gz", "--column-map", "arrival=ts,prompt_tokens=p,output_tokens=o",
                "--max-trace-bytes", "1MiB"),
            "bomb.csv.gz: decompresses to more than the bound of 1.0 MiB (--max-trace-bytes raises it)")


def test_a_long_line_is_refused_at_the_bound_the_flag_sets(cli, write, tmp_path):
    # the tester's 1.8 MB .gz of one 1.9 GB line took 11 GB; the same shape, 2 MiB long
    write("w.csv.gz", gzip.compress(b"ts,in,out\n0,1,1" + b"9" * (2 << 20) + b"\n"))
    refused(cli("run", "w.csv.gz", "--format", "csv", "--column-map", "arrival=ts,prompt_tokens=in,output_tokens=out",
                "--time-unit", "ms", "-q", "--max-line-bytes", "1MiB", "--out", "r"),
            "w.csv.gz line 2: longer than the bound of 1.0 MiB per line (--max-line-bytes raises it)")
    assert not (tmp_path / "r").exists()


def test_a_stray_epoch_timestamp_is_refused_naming_the_rows(cli, write, tmp_path):
    write("epoch.csv", "ts,p,o\n0,5,5\n1,5,5\n1700000000,5,5\n")
    refused(cli("run", "epoch.csv", "--column-map", "arrival=ts,prompt_tokens=p,output_tokens=o", "--out", "r"),
            "epoch.csv line 4 arrives at 1,700,000,000 s, 54 years after line 3", "--max-span-s")
    assert not (tmp_path / "r").exists()


def test_ticks_are_bounded_before_the_replay_starts(cli, write, tmp_path):
    write("long.csv", "ts,p,o\n0,5,5\n1728000,5,5\n")  # 20 days: 6.9M ticks of 0.25 s
    write("fleet.yaml", small_fleet("{path: long.csv, column_map: {arrival: ts, prompt_tokens: p, output_tokens: o}}",
                                    extra="tick_s: 0.25\n"))
    refused(cli("run", "--config", "fleet.yaml", "--out", "r"),
            "tick_s=0.25: the replay would step through 6,912,000 ticks x 1 pool = 6,912,000 tick rows",
            "more than 1,000,000 (each keeps about 2 KB); raise tick_s to 2 s")
    assert not (tmp_path / "r").exists()


def test_two_requests_a_month_apart_are_refused_with_the_tick_s_that_fits(cli, write, tmp_path):
    # the tester's case: 290 s and 5.6 GB for two requests 29 days apart at the default tick_s
    write("long.csv", "ts,in,out\n0,10,10\n2500000,10,10\n")
    refused(cli("run", "long.csv", "--format", "csv", "--column-map", "arrival=ts,prompt_tokens=in,output_tokens=out",
                "--time-unit", "s", "--out", "r"),
            "tick_s=1: the replay would step through 2,500,000 ticks x 1 pool", "raise tick_s to 3 s")
    assert not (tmp_path / "r").exists()


def test_the_tick_bound_counts_every_pool(cli, write, tmp_path):
    # 400,000 s of 1 s ticks fit with one pool, not with three (each tick keeps a row per pool)
    write("long.csv", "ts,p,o\n0,5,5\n400000,5,5\n")
    trace = "{path: long.csv, column_map: {arrival: ts, prompt_tokens: p, output_tokens: o}}"
    pools = "".join(f"  - {{name: p{i}, replicas: 1, workloads: [w{i}]}}\n" for i in range(3))
    write("fleet.yaml", f"model: llama-3.1-8b\ngpu: h100-sxm-80gb\ntrace: {trace}\nsplit: {{policy: by-workload}}\n"
                        f"pools:\n{pools}  - {{name: rest, replicas: 1}}\n")
    refused(cli("run", "--config", "fleet.yaml", "--out", "r"),
            "step through 400,000 ticks x 4 pools = 1,600,000 tick rows", "raise tick_s to 2 s")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("flags, fragment", [
    (["--rate-scale", "1e-300"], "llm-replay: error: --rate-scale 1e-300: expected a number in [1e-06, 1e+06]"),
    (["--window", "0:1e300"], "end_s=1e+300"),
    (["--max-prompt-tokens", "99999999999"], "max_prompt_tokens=99999999999 (expected a token count in [0, "),
    (["--sample", "1e400"], "fraction=inf (expected a number in (0, 1])"),
    (["--max-span-s", "inf"], "--max-span-s: got inf"),
    (["--max-rows", "0"], "--max-rows: got 0"),
    (["--workload", ""], "--workload '': empty label"),
    (["--merge", "azure-code-2023="], "--merge 'azure-code-2023=': empty LABEL"),
    (["--only-workload", "cnv"], "workload 'cnv' matches no request; the trace's workloads: 'conv' (19,366)"),
])
def test_trace_flags_are_bounded_and_never_silent(cli, flags, fragment):
    refused(cli("trace", "inspect", "azure-conv-2023", *flags), fragment)


def test_a_bad_size_is_an_argparse_error(cli):
    res = cli("trace", "inspect", "azure-conv-2023", "--max-trace-bytes", "lots")
    assert res.code == 2
    assert "argument --max-trace-bytes: expected a size in bytes like 3GiB, 500MB or 1000000, got 'lots'" in res.err


def test_the_documented_largest_trace_bound_is_accepted(cli):
    # help and README said "at most 4 GiB" while 4GiB was refused: they now name the true maximum
    res = cli("run", "--help")
    assert "at most 4294967295, 4 GiB less one byte" in " ".join(res.out.split())
    assert cli("trace", "inspect", "azure-conv-2023", "--max-trace-bytes", "4294967295").code == 0
    refused(cli("trace", "inspect", "azure-conv-2023", "--max-trace-bytes", "4GiB"),
            "--max-trace-bytes: got 4294967296, expected bytes in 1..4,294,967,295 (4 GiB less one byte")


@pytest.mark.parametrize("flags, fragment", [
    (["--seed", "-1"], "llm-replay: error: --seed -1: expected >= 0 and <= "),
    (["--seed", "-1", "--sample", "10"], "llm-replay: error: --seed -1: expected >= 0 and <= "),
    (["--seed", "3"], "llm-replay: error: --seed only seeds --sample; give --sample N or drop --seed"),
])
def test_seed_is_checked_and_never_ignored(cli, flags, fragment):
    refused(cli("trace", "inspect", "azure-conv-2023", *flags), fragment)


def test_seed_seeds_the_configs_sample(cli, write):
    write("fleet.yaml", small_fleet("{path: azure-conv-2023, sample: {n: 20, seed: 1}}"))
    figures = [cli("trace", "inspect", "-c", "fleet.yaml", "--json", *flags) for flags in ([], ["--seed", "1"],
                                                                                         ["--seed", "7"])]
    assert [res.code for res in figures] == [0, 0, 0]
    assert figures[0].out == figures[1].out != figures[2].out


def test_a_time_unit_that_does_not_fit_warns(cli, write):
    write("ms.csv", "ts,p,o\n" + "".join(f"{i * 250},5,5\n" for i in range(100)))
    res = cli("trace", "inspect", "ms.csv", "--column-map", "arrival=ts,prompt_tokens=p,output_tokens=o")
    assert res.code == 0
    assert "warning: ms.csv: read as seconds" in res.out and "pass --time-unit ms" in res.out
    res = cli("trace", "inspect", "ms.csv", "--column-map", "arrival=ts,prompt_tokens=p,output_tokens=o", "--json")
    assert json.loads(res.out)["notes"][0].endswith("pass --time-unit ms")


def test_inspect_prints_no_raw_none_and_labels_as_text(cli, write):
    write("one.csv", "ts,p,o\n0,5,5\n0,6,6\n")  # one instant: no rate, no prefix reuse
    res = cli("trace", "inspect", "one.csv", "--column-map", "arrival=ts,prompt_tokens=p,output_tokens=o",
              "--workload", "[/oops]")
    assert res.code == 0, res.err
    assert "None" not in res.out and "[/oops]: 2" in res.out


def test_a_label_that_looks_like_markup_is_printed_as_is(cli, write):
    write("[red]t.csv", "ts,p,o\n0,5,5\n1,6,6\n3,5,5\n")
    res = cli("trace", "inspect", "[red]t.csv", "--column-map", "arrival=ts,prompt_tokens=p,output_tokens=o")
    assert res.code == 0, res.err
    assert "[red]t.csv (csv)" in res.out


def test_merging_a_trace_with_itself_warns_on_run(cli):
    res = cli("run", "mooncake-synthetic", "--merge", "mooncake-synthetic", "--window", ":5", "--out", "r", "-q")
    assert res.code == 0, res.err
    assert "warning: mooncake-synthetic and mooncake-synthetic (the same file twice) share" in res.err
    assert "prefix reuse and cache hits will be inflated" in res.err


def test_a_path_that_closes_a_markup_tag_is_printed_as_is(cli, write):
    write("a[/b].csv", "ts,p,o\n0,5,5\n1,6,6\n")  # a folder 'a[' holding 'b].csv'
    res = cli("run", "a[/b].csv", "--column-map", "arrival=ts,prompt_tokens=p,output_tokens=o", "--out", "r[/x]")
    assert res.code == 0, res.err
    assert res.out.startswith("a[/b].csv: ") and "run written to r[/x]" in res.out
