"""`llm-replay validate vllm-s2r --data DIR` end to end on one real experiment: the table, --json
(errors are (replayed - measured) / measured), and bad input (one line, exit 2)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
DATA = SHARED / "measurements" / "vllm-s2r"
EXP = "20260217"  # Llama-2-7B TP1, codegen at 5 then 10 req/s: 9,000 requests


@pytest.fixture
def data():
    if not DATA.is_dir():
        pytest.skip("no ../shared/measurements/vllm-s2r here")
    return DATA


def test_one_experiment_prints_measured_vs_replayed_per_stage_and_the_mape(cli, data):
    got = cli("validate", "vllm-s2r", "--data", data, "--only", EXP)
    assert got.code == 0, got.err
    lines = [line for line in got.out.splitlines() if "│" in line]
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in lines]
    stages = [r for r in rows if r[3] in ("all", "0: 5/s", "1: 10/s")]
    assert [r[3] for r in stages] == ["all", "0: 5/s", "1: 10/s"]
    assert stages[0][:3] == [EXP, "trainval", "llama-2-7b TP1"]
    assert stages[0][4] == "28.0" and stages[0][7] == "10.6" and stages[0][10] == "2,081"  # measured means
    assert all(r[6].endswith("%") and r[9].endswith("%") and r[12].endswith("%") for r in stages)
    assert [r[13] for r in stages] == ["stable"] * 3  # the replay's class per stage, as measured
    assert "CPU KV offload (8 GiB): not modelled" in stages[0][14]
    header = next(line for line in got.out.splitlines() if "┃" in line and "experiment" in line)
    assert header.split("┃")[-2].strip() == "notes"
    assert "saturation: 1 of 1 runs replay in their measured class" in got.out
    mape = {(r[0], r[1]): r for r in rows if r[1] in ("whole runs", "stages")}
    assert set(mape) == {("trainval", "whole runs"), ("trainval", "stages"), ("all", "whole runs"),
                         ("all", "stages")}  # no validation experiment ran
    assert mape["all", "whole runs"][2] == "1" and mape["all", "stages"][2] == "2"


def test_json_errors_are_replayed_minus_measured_over_measured(cli, data):
    got = cli("validate", "vllm-s2r", "--data", data, "--only", EXP, "--json")
    assert got.code == 0, got.err
    doc = json.loads(got.out)
    rows = doc["rows"]
    assert {(r["stage"], r["metric"]) for r in rows} >= {
        (s, m) for s in (-1, 0, 1) for m in ("ttft_mean", "ttft_p90", "ttft_p99", "itl_mean", "e2e_mean",
                                             "e2e_p90", "e2e_p99")}
    for r in rows:
        assert r["experiment"] == EXP and r["replayed"] is not None
        assert r["error_pct"] == pytest.approx((r["replayed"] - r["measured"]) / r["measured"] * 100)
    whole = {r["metric"]: r for r in rows if r["stage"] == -1}
    assert whole["ttft_mean"]["measured"] == pytest.approx(27.9818063)
    (exp,) = doc["experiments"]
    assert exp["unfinished"] == 0 and exp["replayed"]["-1"]["requests"] == 9000
    # ITL as the harness computed it: over its re-tokenised count of 195.09 tokens, not 247
    replayed = exp["replayed"]["-1"]
    assert whole["itl_mean"]["replayed"] == pytest.approx(
        (replayed["e2e_mean"] - replayed["ttft_mean"]) / (195.09044444 - 1))
    means = [abs(whole[f"{f}_mean"]["error_pct"]) for f in ("ttft", "itl", "e2e")]
    assert [doc["mape"]["all"]["whole_run"][f]["mape_pct"] for f in ("ttft", "itl", "e2e")] == pytest.approx(means)
    assert doc["mape"]["validation"]["whole_run"]["ttft"] == {"rows": 0, "mape_pct": None}


def _one_line_exit_2(got) -> str:
    assert got.code == 2 and got.out == ""
    lines = got.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llm-replay: error: ") and "Traceback" not in got.err
    return lines[0]


def test_without_data_it_says_to_pass_the_measurements_folder(cli):
    line = _one_line_exit_2(cli("validate", "vllm-s2r"))
    assert "pass the measurements folder with --data DIR" in line


def test_a_missing_folder_or_a_corrupted_row_is_one_line(cli, tmp_path, data):
    line = _one_line_exit_2(cli("validate", "vllm-s2r", "--data", tmp_path / "nosuch"))
    assert "nosuch: not a folder" in line
    copy = tmp_path / "copy"
    shutil.copytree(data, copy)
    truth = copy / "ground_truth.csv"
    truth.chmod(0o644)
    text = truth.read_text()
    truth.write_text(text.replace("20260217,trainval,0,all,ttft_mean,", "20260217,trainval,0,all,ttft_mean,-", 1))
    line = _one_line_exit_2(cli("validate", "vllm-s2r", "--data", copy, "--only", EXP))
    assert "ground_truth.csv: line" in line and "(exp_id 20260217): column actual: got '-25.03" in line
    assert "expected a number >= 0" in line


def test_only_an_unknown_id_and_data_for_a_scenario_file_are_refused(cli, tmp_path, data):
    line = _one_line_exit_2(cli("validate", "vllm-s2r", "--data", data, "--only", "2026"))
    assert "--only 2026: no experiment" in line and "known: 17, 20" in line
    scenarios = tmp_path / "sc.yaml"
    scenarios.write_text("scenarios: []\n")
    line = _one_line_exit_2(cli("validate", scenarios, "--data", data))
    assert "--data: applies to 'validate vllm-s2r' only" in line


def test_a_run_whose_replayed_class_differs_from_the_measured_one_is_flagged(cli, tmp_path, data):
    """The flag, not the finding: 20260217 is marked unsafe in a copy, so the real server counts as
    overloaded while its replay stays stable, and the table, the summary line and --json say so."""
    import csv

    copy = tmp_path / "copy"
    shutil.copytree(data, copy)
    path = copy / "experiments.csv"
    path.chmod(0o644)
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        fields, rows = reader.fieldnames, list(reader)
    for row in rows:
        if row["exp_id"] == EXP:
            row["manifest_notes"] = "unsafe: marked for this test"
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    got = cli("validate", "vllm-s2r", "--data", copy, "--only", EXP)
    assert got.code == 0, got.err
    assert f"saturation: 0 of 1 runs replay in their measured class; differs: {EXP} (replayed stable, " \
           "measured overloaded)" in got.out
    whole = next(line for line in got.out.splitlines() if line.startswith(f"│ {EXP}"))
    assert "stable (measured" in whole and "unsafe: overloaded for real" in whole
    doc = json.loads(cli("validate", "vllm-s2r", "--data", copy, "--only", EXP, "--json").out)
    (exp,) = doc["experiments"]
    assert exp["saturation"] == {"measured": "overloaded", "replayed": {"-1": "stable", "0": "stable", "1": "stable"},
                                 "differs": True}
