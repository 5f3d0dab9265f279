"""`llm-replay plan` end to end: the answer, the config it writes, the figure, and bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.e2e.conftest import read_run

COLUMNS = "arrival=arrival,prompt_tokens=prompt_tokens,output_tokens=output_tokens,workload=workload"


@pytest.fixture
def two_pools(write):
    rng = np.random.default_rng(3)
    n = 300
    rows = zip(np.sort(rng.uniform(0, 30, n)), rng.integers(500, 4000, n), rng.integers(50, 300, n),
               np.where(rng.uniform(size=n) < 0.7, "chat", "batch"))
    write("two.csv", "arrival,prompt_tokens,output_tokens,workload\n" + "".join(
        f"{a:.3f},{p},{o},{w}\n" for a, p, o, w in rows))
    write("fleet.yaml", """
        model: llama-3.1-8b
        gpu: h100-sxm-80gb
        pools:
          - {name: chat, workloads: [chat], replicas: 1}
          - {name: batch, workloads: [batch], replicas: 1}
    """)
    return ["two.csv", "--format", "csv", "--column-map", COLUMNS, "--time-unit", "s", "--config", "fleet.yaml",
            "--slo", "ttft_ms=500,tpot_ms=30"]


def test_the_plan_written_replays_to_the_attainment(cli, two_pools, tmp_path):
    got = cli("plan", *two_pools, "--gpu", "h100-sxm-80gb,a100-sxm-80gb", "--tp", "1,2",
              "--workers", "1", "--out", "plan.yaml")
    assert got.code == 0, got.err
    assert "cheapest fleet meeting 99.00%" in got.out and "frontier" in got.out and "replays" in got.out
    head = (tmp_path / "plan.yaml").read_text().splitlines()[0]
    assert head.startswith("# llm-replay plan: the cheapest fleet found that meets 99.00%")
    ran = cli("run", "--config", "plan.yaml", "--out", "r", "--quiet")
    assert ran.code == 0, ran.err
    run = read_run(tmp_path / "r")
    assert all(p["slo_attainment"] >= 0.99 for p in run.summary["pools"].values())


def test_workers_do_not_change_the_answer(cli, two_pools, tmp_path):
    args = [*two_pools, "--gpu", "h100-sxm-80gb", "--tp", "1,2", "--quantization", "none,fp8", "--json"]
    one, two = cli("plan", *args, "--workers", "1"), cli("plan", *args, "--workers", "2")
    assert one.code == two.code == 0, two.err
    a, b = json.loads(one.out), json.loads(two.out)
    assert a["winner"] == b["winner"] and a["candidates"] == b["candidates"] and a["frontier"] == b["frontier"]
    assert a["winner"]["slo_attainment"] >= 0.99


def test_no_fleet_meets_says_so_and_shows_the_best(cli, two_pools, tmp_path):
    got = cli("plan", *two_pools[:-1], "ttft_ms=1,tpot_ms=1", "--max-replicas", "2", "--workers", "1",
              "--out", "plan.yaml")
    assert got.code == 1
    assert "no fleet in the search space meets" in got.out and "best found" in got.out
    assert not (tmp_path / "plan.yaml").exists()


def test_a_candidate_that_does_not_fit_is_named(cli, two_pools, write):
    write("big.yaml", """
        model: llama-3.1-70b
        pools: [{name: chat, workloads: [chat]}, {name: batch, workloads: [batch]}]
    """)
    args = [a if a != "fleet.yaml" else "big.yaml" for a in two_pools]
    got = cli("plan", *args, "--gpu", "h100-sxm-80gb", "--tp", "1", "--workers", "1")
    assert got.code == 1 and "no fleet in the search space meets" in got.out
    assert "h100-sxm-80gb tp1 native: not searched: pools[0] (chat): llama-3.1-70b in bf16 does not fit" in got.out


def test_the_figure(cli, two_pools, tmp_path):
    pytest.importorskip("matplotlib")
    got = cli("plan", *two_pools, "--gpu", "h100-sxm-80gb", "--workers", "1", "--plot", "plan.svg")
    assert got.code == 0, got.err
    svg = (tmp_path / "plan.svg").read_text()
    assert svg.startswith("<?xml") and "cost against attainment" in svg


@pytest.mark.parametrize("flags, words", [
    (["--slo", "ttft=5"], "plan: --slo: got 'ttft=5', expected KEY=MS"),
    (["--attainment", "1.5"], "plan: --attainment: got 1.5, expected a share of requests in (0, 1]"),
    (["--gpu", "h100"], "plan: --gpu: unknown GPU 'h100'"),
    (["--tp", "3"], "plan: --tp: got '3'"),
    (["--quantization", "fp7"], "plan: --quantization: got 'fp7'"),
    (["--plot", "plan.txt"], "plan: --plot: got 'plan.txt', expected a file name ending in .svg or .png"),
    (["--max-replicas", "0"], "plan: --max-replicas: got 0"),
    (["--workers", "0"], "plan: --workers: got 0"),
])
def test_bad_flags_are_one_line_and_nothing_runs(cli, two_pools, tmp_path, flags, words):
    got = cli("plan", *two_pools, *flags, "--out", "plan.yaml")
    assert got.code == 2
    assert words in got.err and len(got.err.strip().splitlines()) == 1 and "Traceback" not in got.err
    assert not (tmp_path / "plan.yaml").exists()


def test_an_existing_out_is_kept(cli, two_pools, write):
    mine = write("plan.yaml", "mine: true\n")
    got = cli("plan", *two_pools, "--out", "plan.yaml")
    assert got.code == 2 and "--out plan.yaml: already exists" in got.err
    assert mine.read_text() == "mine: true\n"


def test_a_prefill_decode_fleet_is_refused(cli, write):
    write("pd.yaml", """
        model: llama-3.1-8b
        split: {policy: prefill-decode, prefill_pool: p, decode_pool: d}
        pools:
          - {name: p, replicas: 1}
          - {name: d, replicas: 1}
    """)
    got = cli("plan", "--config", "pd.yaml")
    assert got.code == 2 and "split.prefill_pool" in got.err


def test_an_autoscaled_pool_gets_its_bound(cli, two_pools, write, tmp_path):
    """An autoscaled pool's searched count is autoscaler.max_replicas: the plan's config keeps the
    policy and a floor within the bound, and replays to the attainment."""
    write("fleet.yaml", """
        model: llama-3.1-8b
        gpu: h100-sxm-80gb
        pools:
          - name: chat
            workloads: [chat]
            replicas: 1
            autoscaler: {policy: queue-depth, min_replicas: 1, max_replicas: 2}
          - {name: batch, workloads: [batch], replicas: 1}
    """)
    relaxed = [*two_pools[:-1], "ttft_ms=5000,tpot_ms=100"]
    got = cli("plan", *relaxed, "--workers", "1", "--out", "plan.yaml", "--json")
    assert got.code == 0, got.err
    assert "chat <=" in got.err  # the progress shows the bound it tried
    import yaml

    chat = yaml.safe_load((tmp_path / "plan.yaml").read_text())["pools"][0]
    assert chat["autoscaler"]["policy"] == "queue-depth"
    bound = json.loads(got.out)["winner"]["pools"]["chat"]["replicas"]
    assert chat["autoscaler"]["max_replicas"] == bound
    assert chat["autoscaler"]["min_replicas"] <= chat["replicas"] <= bound
    assert cli("run", "--config", "plan.yaml", "--out", "r", "--quiet").code == 0
    assert read_run(tmp_path / "r").summary["pools"]["chat"]["slo_attainment"] >= 0.99
