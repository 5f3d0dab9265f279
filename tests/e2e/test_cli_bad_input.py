"""Bad input to `llm-replay`: exit code 2, one line on stderr, no traceback, no output directory.

Each message must start with `llm-replay: error:`, name the file and line (or the config key),
show the value, and say what was expected. The files are written next to the assertions, in the
test's own temporary working directory, so the names in the messages are the short ones below.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from tests.e2e.conftest import FIXTURES, RUN_FILES

AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
ROW = "2023-11-16 18:15:46.6805900,374,44\n"
MC = '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}\n'
SMALL = "model: llama-3.1-8b\ngpu: h100-sxm-80gb\npools:\n  - {name: a, replicas: 1}\n"


def _gz_truncated() -> bytes:
    data = gzip.compress((AZ + ROW * 400).encode())
    return data[: len(data) // 2]


# name -> (files to write, argv after `run`, fragments the error line must contain)
TRACE_CASES = {
    "malformed csv line": (
        {"bad.csv": AZ + ROW + 'this is, not "valid\n'},
        ["bad.csv"], ["bad.csv line 3", "expected 3 fields", 'this is, not "valid']),
    "malformed jsonl line": (
        {"bad.jsonl": MC + '{"timestamp": 1, "input_length": 5\n'},
        ["bad.jsonl"], ["bad.jsonl line 2", "invalid JSON", '{"timestamp": 1, "input_length": 5']),
    "missing csv field": (
        {"short.csv": AZ + ROW + "2023-11-16 18:15:47.0,3\n"},
        ["short.csv"], ["short.csv line 3", "expected 3 fields", "found 2", "2023-11-16 18:15:47.0,3"]),
    "missing jsonl key": (
        {"nokey.jsonl": MC + '{"timestamp": 1, "output_length": 1, "hash_ids": [0]}\n'},
        ["nokey.jsonl"], ["nokey.jsonl line 2", "'input_length'", "expected"]),
    "negative tokens csv": (
        {"neg.csv": AZ + ROW + "2023-11-16 18:15:47.0,-3,4\n"},
        ["neg.csv"], ["neg.csv line 3", "ContextTokens='-3'", "negative", "expected"]),
    "negative tokens jsonl": (
        {"neg.jsonl": MC + '{"timestamp": 1, "input_length": 5, "output_length": -2, "hash_ids": [0]}\n'},
        ["neg.jsonl"], ["neg.jsonl line 2", "output_length", "-2", "negative", "expected"]),
    "fractional tokens csv": (
        {"frac.csv": AZ + ROW + "2023-11-16 18:15:47.0,12.5,4\n"},
        ["frac.csv"], ["frac.csv line 3", "ContextTokens='12.5'", "whole number", "expected"]),
    "fractional tokens jsonl": (
        {"frac.jsonl": MC + '{"timestamp": 1, "input_length": 5.5, "output_length": 1, "hash_ids": [0]}\n'},
        ["frac.jsonl"], ["frac.jsonl line 2", "input_length", "5.5", "whole number", "expected"]),
    "NaN tokens csv": (
        {"nan.csv": AZ + ROW + "2023-11-16 18:15:47.0,5,NaN\n"},
        ["nan.csv"], ["nan.csv line 3", "GeneratedTokens='NaN'", "finite", "expected"]),
    "NaN tokens jsonl": (
        {"nan.jsonl": MC + '{"timestamp": 1, "input_length": NaN, "output_length": 1, "hash_ids": [0]}\n'},
        ["nan.jsonl"], ["nan.jsonl line 2", "input_length", "finite", "expected"]),
    "non-numeric tokens csv": (
        {"text.csv": AZ + ROW + "2023-11-16 18:15:47.0,abc,4\n"},
        ["text.csv"], ["text.csv line 3", "ContextTokens='abc'", "not a number", "expected"]),
    "non-numeric tokens jsonl": (
        {"text.jsonl": MC + '{"timestamp": 1, "input_length": "many", "output_length": 1, "hash_ids": [0]}\n'},
        ["text.jsonl"], ["text.jsonl line 2", "input_length", "'many'", "not a number", "expected"]),
    "unparseable timestamp csv": (
        {"time.csv": AZ + ROW + "not-a-time,3,4\n"},
        ["time.csv"], ["time.csv line 3", "TIMESTAMP='not-a-time'", "expected a timestamp"]),
    "unparseable timestamp jsonl": (
        {"time.jsonl": MC + '{"timestamp": "soon", "input_length": 5, "output_length": 1, "hash_ids": [0]}\n'},
        ["time.jsonl"], ["time.jsonl line 2", "timestamp='soon'", "expected"]),
    "empty file": (
        {"empty.csv": ""},
        ["empty.csv"], ["empty.csv", "empty", "expected"]),
    "header with no rows": (
        {"header.csv": AZ},
        ["header.csv"], ["header.csv", "no requests", "expected"]),
    "unknown --format": (
        {"ok.csv": AZ + ROW},
        ["ok.csv", "--format", "bogus"], ["ok.csv", "'bogus'", "known", "azure", "mooncake"]),
    "truncated gz": (
        {"trunc.csv.gz": _gz_truncated()},
        ["trunc.csv.gz"], ["trunc.csv.gz", "truncated", "expected"]),
    "binary file": (
        {"binary.csv": bytes(range(256)) * 8},
        ["binary.csv"], ["binary.csv", "not a text file", "expected"]),
    "binary file without NUL bytes": (
        {"latin.csv": b"\xff\xfe\x80\x81 not utf-8 \xc3\x28\n" * 20},
        ["latin.csv"], ["latin.csv", "not a text file", "expected"]),
    "missing trace file": (
        {},
        ["nosuch.csv"], ["nosuch.csv", "not found"]),
    "missing trace file named by the config": (
        {"fleet.yaml": "trace: {path: gone.jsonl}\n" + SMALL},
        ["--config", "fleet.yaml"], ["gone.jsonl", "not found"]),
}

CONFIG_CASES = {
    "unknown top-level key": (
        "modle: llama-3.1-8b\n",
        ["fleet.yaml", "'modle'", "known keys", "model", "pools"]),
    "unknown engine key": (
        "model: llama-3.1-8b\npools:\n  - {name: a, engine: {max_num_seqs: 8, max_batch: 3}}\n",
        ["fleet.yaml", "'pools[0].engine.max_batch'", "known keys", "max_num_seqs", "max_num_batched_tokens"]),
    "unknown trace key": (
        "model: llama-3.1-8b\ntrace: {window: {end: 10}}\npools: [{name: a}]\n",
        ["fleet.yaml", "'trace.window.end'", "known keys", "end_s", "start_s"]),
    "unknown router": (
        "model: llama-3.1-8b\npools:\n  - {name: a, replicas: 1, router: fastest}\n",
        ["fleet.yaml", "pools[0]", "router", "'fastest'", "known", "least-outstanding", "round-robin"]),
    "negative replicas": (
        "model: llama-3.1-8b\npools:\n  - {name: a, replicas: -1}\n",
        ["fleet.yaml", "pools[0]", "replicas", "-1", "expected", ">= 0"]),
    "fractional replicas": (
        "model: llama-3.1-8b\npools:\n  - {name: a, replicas: 2.5}\n",
        ["fleet.yaml", "pools[0].replicas", "2.5", "expected an integer"]),
    "model does not fit at that TP": (
        "model: llama-3.1-70b\ngpu: h100-sxm-80gb\npools:\n  - {name: a, replicas: 1, tensor_parallel_size: 1}\n",
        ["pools[0]", "llama-3.1-70b", "h100-sxm-80gb", "tensor_parallel_size 1", "does not fit",
         "short by 66.5 GB", "tensor_parallel_size >= 2"]),
    "python object YAML tag": (
        'model: !!python/object/apply:os.system ["echo hi"]\n',
        ["fleet.yaml line 1", "python/object/apply:os.system"]),
    "duplicate YAML key": (
        "model: llama-3.1-8b\nmodel: llama-3.1-70b\n",
        ["fleet.yaml line 2", "duplicate key 'model'"]),
    "empty config": (
        "",
        ["fleet.yaml", "empty", "expected"]),
    "every pool with 0 replicas": (
        "pools:\n  - {name: a, replicas: 0}\n  - {name: b, replicas: 0}\n",
        ["fleet.yaml", "pools", "0 replicas"]),
    "workload that goes to no pool": (
        "model: llama-3.1-8b\npools:\n  - {name: a, replicas: 1, workloads: [code]}\n",
        ["pools", "workload 'azure'", "goes to no pool", "workloads"]),
    "not valid YAML": (
        "model: [unclosed\n",
        ["fleet.yaml line 2", "not valid YAML"]),
    "prefill-decode with one pool": (
        "model: llama-3.1-8b\nsplit: {policy: prefill-decode}\npools: [{name: a}]\n",
        ["fleet.yaml", "split", "prefill-decode needs exactly two pools", "got 1"]),
    "prefill-decode naming a pool that is not there": (
        "model: llama-3.1-8b\nsplit: {policy: prefill-decode, decode_pool: dec}\npools: [{name: p}, {name: d}]\n",
        ["fleet.yaml", "split.decode_pool", "'dec'", "pools: p, d"]),
    "prefill-decode with one pool for both": (
        "model: llama-3.1-8b\nsplit: {policy: prefill-decode, prefill_pool: d, decode_pool: d}\n"
        "pools: [{name: p}, {name: d}]\n",
        ["fleet.yaml", "prefill_pool and decode_pool are both 'd'"]),
    "prefill-decode with different block sizes": (
        "model: llama-3.1-8b\nsplit: {policy: prefill-decode}\n"
        "pools: [{name: p}, {name: d, engine: {block_size: 32}}]\n",
        ["fleet.yaml", "pools[1].engine.block_size", "32", "expected 16"]),
    "prefill-decode with workload lists": (
        "model: llama-3.1-8b\nsplit: {policy: prefill-decode}\npools: [{name: p, workloads: [azure]}, {name: d}]\n",
        ["fleet.yaml", "pools[0].workloads", "remove the list"]),
    "unknown link": (
        "model: llama-3.1-8b\nsplit: {policy: prefill-decode, link: carrier-pigeon}\npools: [{name: p}, {name: d}]\n",
        ["fleet.yaml", "split.link", "'carrier-pigeon'", "nvlink4", "pcie5x16", "ib-ndr", "eth-25g"]),
    "negative transfer latency": (
        "model: llama-3.1-8b\nsplit: {policy: prefill-decode, base_latency_ms: -1}\npools: [{name: p}, {name: d}]\n",
        ["fleet.yaml", "split.base_latency_ms", "-1", "expected >= 0"]),
    "unknown transfer mode": (
        "model: llama-3.1-8b\nsplit: {policy: prefill-decode, transfer: pipelined}\npools: [{name: p}, {name: d}]\n",
        ["fleet.yaml", "split.transfer", "'pipelined'", "layerwise", "serial"]),
    "decode pool smaller than one request's KV": (
        "model: llama-3.1-8b\nsplit: {policy: prefill-decode}\n"
        "pools: [{name: p}, {name: d, engine: {num_gpu_blocks_override: 100}}]\n",
        ["fleet.yaml", "pools[1]", "max_model_len", "cannot fit"]),
}


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def check_usage_error(res, fragments, before: set[str], root: Path) -> str:
    assert res.code == 2, (res.code, res.err)
    assert res.out == ""
    assert "Traceback" not in res.err
    lines = res.err.splitlines()
    assert len(lines) == 1, res.err
    line = lines[0]
    assert line.startswith("llm-replay: error: "), line
    for fragment in fragments:
        assert fragment in line, (fragment, line)
    # No output directory, no half-written temp dir, nothing else new.
    assert _listing(root) == before, sorted(_listing(root) - before)
    return line


@pytest.mark.parametrize("case", sorted(TRACE_CASES))
def test_bad_trace(cli, write, tmp_path, case):
    files, argv, fragments = TRACE_CASES[case]
    for name, content in files.items():
        write(name, content)
    before = _listing(tmp_path)
    res = cli("run", *argv, "--out", "runs/bad", "-q")
    check_usage_error(res, fragments, before, tmp_path)


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_bad_config(cli, write, tmp_path, case):
    text, fragments = CONFIG_CASES[case]
    write("fleet.yaml", text)
    write("ok.csv", AZ + ROW)
    before = _listing(tmp_path)
    res = cli("run", "ok.csv", "--config", "fleet.yaml", "--out", "runs/bad", "-q")
    check_usage_error(res, fragments, before, tmp_path)


def test_yaml_tags_construct_no_python_object(cli, write, tmp_path):
    """The issue's `os.system` tag, and ones with a visible effect, run nothing."""
    write("a.yaml", 'model: !!python/object/apply:os.system ["echo hi > hi.txt"]\n')
    write("b.yaml", '!!python/object/apply:os.system ["touch pwned"]\n')
    write("c.yaml", 'pools:\n  - !!python/object/apply:os.mkdir ["pwned-dir"]\n')
    write("d.yaml", "model: !!python/name:os.system\n")
    write("ok.csv", AZ + ROW)
    for cfg in ("a.yaml", "b.yaml", "c.yaml", "d.yaml"):
        res = cli("run", "ok.csv", "--config", cfg, "--out", "runs/bad", "-q")
        assert res.code == 2 and res.err.startswith(f"llm-replay: error: {cfg} line "), res.err
        assert len(res.err.splitlines()) == 1
    for effect in ("hi.txt", "pwned", "pwned-dir", "runs"):
        assert not (tmp_path / effect).exists(), effect


def test_missing_config_file(cli, write, tmp_path):
    write("ok.csv", AZ + ROW)
    before = _listing(tmp_path)
    res = cli("run", "ok.csv", "--config", "nosuch.yaml", "--out", "runs/bad", "-q")
    check_usage_error(res, ["nosuch.yaml", "not found"], before, tmp_path)


def test_existing_out_without_force_is_left_alone(cli, write, tmp_path):
    write("ok.csv", AZ + ROW)
    write("fleet.yaml", SMALL)
    write("runs/old/notes.txt", "keep me")
    before = _listing(tmp_path)
    res = cli("run", "ok.csv", "--config", "fleet.yaml", "--out", "runs/old", "-q")
    check_usage_error(res, ["runs/old", "already exists", "--force"], before, tmp_path)
    assert (tmp_path / "runs" / "old" / "notes.txt").read_text() == "keep me"


def test_existing_out_is_checked_before_the_trace_is_read(cli, write, tmp_path):
    """The --out check comes first: a slow trace load is not wasted on a run that cannot be written."""
    write("fleet.yaml", SMALL)
    write("runs/old/notes.txt", "keep me")
    res = cli("run", "nosuch.csv", "--config", "fleet.yaml", "--out", "runs/old", "-q")
    assert res.code == 2 and "already exists" in res.err


def test_context_overflow_is_not_an_input_error(cli, write, tmp_path):
    write("l2.yaml", "model: llama-2-7b\npools:\n  - {name: a, replicas: 1}\n")
    res = cli("run", FIXTURES / "azure_conv_context_overflow.csv", "--config", "l2.yaml", "--out", "ctx", "-q")
    assert res.code == 0, res.err
    assert "error" not in res.err
    assert {p.name for p in (tmp_path / "ctx").iterdir()} == RUN_FILES


@pytest.mark.parametrize(("argv", "fragments"), [
    (["capacity", "--model", "llama-3.1-70b", "--gpu", "h100-sxm-80gb", "--tp", "1"],
     ["llama-3.1-70b", "h100-sxm-80gb", "--tp 1", "0.9 x 85.06 GB", "short by 66.5 GB", "--tp >= 2"]),
    (["capacity", "--model", "llama-9", "--gpu", "h100-sxm-80gb"], ["'llama-9'", "known", "llama-3.1-8b"]),
    (["capacity", "--model", "llama-3.1-8b", "--gpu", "h100", "--tp", "1"], ["'h100'", "known", "h100-sxm-80gb"]),
    (["capacity", "--model", "llama-3.1-8b", "--gpu", "h100-sxm-80gb", "--kv-cache-dtype", "int2"],
     ["'int2'", "known", "fp8"]),
    (["capacity", "--model", "llama-3.1-70b", "--gpu", "h100-sxm-80gb", "--tp", "0"], ["--tp", "0"]),
    (["trace", "inspect", "empty.csv"], ["empty.csv", "empty"]),
    (["trace", "inspect", "nosuch.csv", "--json"], ["nosuch.csv", "not found"]),
])
def test_bad_input_to_other_commands(cli, write, tmp_path, argv, fragments):
    write("empty.csv", "")
    before = _listing(tmp_path)
    check_usage_error(cli(*argv), fragments, before, tmp_path)


# --- bugs ------------------------------------------------------------------------------------------


def test_mixed_type_unknown_keys(cli, write, tmp_path):
    write("fleet.yaml", "modle: llama-3.1-8b\n1: 2\n")
    write("ok.csv", AZ + ROW)
    before = _listing(tmp_path)
    res = cli("run", "ok.csv", "--config", "fleet.yaml", "--out", "runs/bad", "-q")
    check_usage_error(res, ["fleet.yaml", "unknown key", "known keys"], before, tmp_path)


def test_unknown_pool_model_names_the_key(cli, write, tmp_path):
    write("fleet.yaml", "model: llama-3.1-8b\npools:\n  - {name: a, workloads: [chat]}\n  - {name: b, model: llama-9}\n")
    write("ok.csv", AZ + ROW)
    before = _listing(tmp_path)
    res = cli("run", "ok.csv", "--config", "fleet.yaml", "--out", "runs/bad", "-q")
    check_usage_error(res, ["fleet.yaml", "pools[1]", "'llama-9'", "known"], before, tmp_path)


def test_unknown_gpu_names_the_config_file(cli, write, tmp_path):
    write("fleet.yaml", "gpu: h100\n")
    write("ok.csv", AZ + ROW)
    before = _listing(tmp_path)
    res = cli("run", "ok.csv", "--config", "fleet.yaml", "--out", "runs/bad", "-q")
    check_usage_error(res, ["fleet.yaml", "gpu", "'h100'", "known"], before, tmp_path)


def test_does_not_fit_names_the_config_file(cli, write, tmp_path):
    write("fleet.yaml", "model: llama-3.1-70b\npools:\n  - {name: a, replicas: 1, tensor_parallel_size: 1}\n")
    write("ok.csv", AZ + ROW)
    before = _listing(tmp_path)
    res = cli("run", "ok.csv", "--config", "fleet.yaml", "--out", "runs/bad", "-q")
    check_usage_error(res, ["fleet.yaml", "pools[0]", "short by"], before, tmp_path)


def test_out_dot_with_force(cli, write, tmp_path, monkeypatch):
    write("work/ok.csv", AZ + ROW)
    write("work/fleet.yaml", SMALL)
    monkeypatch.chdir(tmp_path / "work")
    before = _listing(tmp_path)
    res = cli("run", "ok.csv", "--config", "fleet.yaml", "--out", ".", "--force", "-q")
    check_usage_error(res, ["--out"], before, tmp_path)


def test_out_under_a_file(cli, write, tmp_path):
    write("ok.csv", AZ + ROW)
    write("fleet.yaml", SMALL)
    write("afile", "not a directory")
    before = _listing(tmp_path)
    res = cli("run", "ok.csv", "--config", "fleet.yaml", "--out", "afile/run", "-q")
    check_usage_error(res, ["afile"], before, tmp_path)


def test_fleet_that_does_not_fit_is_one_line_even_with_a_trace_window(cli, write, tmp_path):
    write("fleet.yaml", "model: llama-3.1-70b\ntrace: {path: azure-code-2023, window: {end_s: 60}}\n"
                        "pools:\n  - {name: a, replicas: 1, tensor_parallel_size: 1}\n")
    before = _listing(tmp_path)
    res = cli("run", "--config", "fleet.yaml", "--out", "runs/bad", "-q")
    check_usage_error(res, ["pools[0]", "short by"], before, tmp_path)


@pytest.mark.parametrize("argv, fragments", [
    (["run", "--max-rows", "1e99"], ["run: argument --max-rows: invalid int value: '1e99'"]),
    (["run", "--seed", "1e99"], ["run: argument --seed: invalid int value: '1e99'"]),
    (["run", "--max-prompt-tokens", "1e99"], ["run: argument --max-prompt-tokens"]),
    (["run", "--max-trace-bytes", "0"], ["run: argument --max-trace-bytes: expected a size in bytes"]),
    (["run", "--max-trace-bytes", "-5"], ["run: argument --max-trace-bytes: expected a size in bytes"]),
    (["run", "--time-unit", "h"], ["run: argument --time-unit: invalid choice: 'h'"]),
    (["run", "--window", "-5:"], ["run: argument --window: expected one argument", "--window=-5:"]),
    (["trace", "inspect", "--window", "-5:"], ["trace inspect: argument --window", "(see llm-replay trace inspect --help)"]),
    (["trace"], ["trace: the following arguments are required: SUBCOMMAND"]),
    (["demo", "nosuch"], ["demo: argument SCENARIO: invalid choice: 'nosuch'"]),
    (["calibrate", "x.csv"], ["calibrate: the following arguments are required", "(see llm-replay calibrate --help)"]),
    (["validate"], ["validate: ", "(see llm-replay validate --help)"]),
    (["profile", "--tp", "x"], ["profile: ", "(see llm-replay profile --help)"]),
    (["tui", "a", "b"], ["tui: ", "(see llm-replay tui --help)"]),
    (["run", "--bogus"], ["run: unrecognized arguments: --bogus (see llm-replay run --help)"]),
    (["trace", "inspect", "x", "--bogus"], ["trace inspect: unrecognized arguments: --bogus"]),
    (["nosuch"], ["llm-replay: error: argument COMMAND: invalid choice: 'nosuch'", "(see llm-replay --help)"]),
])
def test_argparse_mistakes_are_one_line(cli, tmp_path, argv, fragments):
    """argparse's own errors printed its whole usage block; now one line like every other mistake."""
    before = _listing(tmp_path)
    line = check_usage_error(cli(*argv), fragments, before, tmp_path)
    assert line.endswith(" --help)") and "usage:" not in line


def test_a_window_value_that_starts_with_a_dash_is_read_after_equals(cli, tmp_path):
    before = _listing(tmp_path)
    line = check_usage_error(cli("trace", "inspect", "azure-conv-2023", "--window=-5:"), ["--window"], before, tmp_path)
    assert "expected one argument" not in line
