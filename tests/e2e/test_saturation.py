"""Every run says whether each pool kept up: a replay at twice one replica's capacity is
overloaded, one at half of it stable, in summary.json and in the table `run` prints."""

from __future__ import annotations

import json

FLAGS = ("--format", "csv", "--column-map", "arrival=ts,prompt_tokens=in,output_tokens=out", "--time-unit", "ms")
ONE_REPLICA = "model: llama-3.1-8b\ngpu: h100-sxm-80gb\npools:\n  - {name: a, replicas: 1}\n"


def constant_rate(write, name: str, rate_per_s: float, seconds: float, prompt: int = 1000, output: int = 200):
    """Requests of one size at a constant rate (inference-perf's constant-rate stage)."""
    n = round(rate_per_s * seconds)
    rows = "".join(f"{i * 1000 / rate_per_s:.3f},{prompt},{output}\n" for i in range(n))
    return write(name, "ts,in,out\n" + rows)


def replay(cli, trace, cfg, out: str) -> tuple[dict, str]:
    res = cli("run", trace, "--config", cfg, *FLAGS, "--out", out)
    assert res.code == 0, res.err
    return json.loads(open(f"{out}/summary.json").read()), res.out


def test_twice_a_replicas_capacity_is_overloaded_and_half_of_it_stable(cli, write):
    cfg = write("one.yaml", ONE_REPLICA)
    # the capacity: what one replica completes while far more arrives than it can serve
    flood, _ = replay(cli, constant_rate(write, "flood.csv", 100, 40), cfg, "flood")
    capacity = flood["pools"]["a"]["saturation"]["completion_rate_per_s"]
    assert flood["pools"]["a"]["saturation"]["class"] == "overloaded"
    assert 1 < capacity < 100

    over, table = replay(cli, constant_rate(write, "over.csv", 2 * capacity, 60), cfg, "over")
    got = over["pools"]["a"]["saturation"]
    assert got["class"] == "overloaded"
    assert got["arrival_rate_per_s"] > got["completion_rate_per_s"]
    assert got["queue_slope_per_s"] > 0.25 * got["arrival_rate_per_s"]  # about half of it, the excess
    assert got["queue_peak"] > 0.25 * capacity * 60
    assert "saturation" in table and "overloaded" in table

    under, table = replay(cli, constant_rate(write, "under.csv", capacity / 2, 60), cfg, "under")
    got = under["pools"]["a"]["saturation"]
    assert got["class"] == "stable", got
    assert got["queue_peak"] < 10
    assert "stable" in table


def test_a_prefill_pool_that_cannot_keep_up_is_the_overloaded_one(cli, write):
    # long prompts, short answers: one prefill replica is the bottleneck, the decode pool idles
    cfg = write("pd.yaml", "model: llama-3.1-8b\ngpu: h100-sxm-80gb\nsplit: {policy: prefill-decode}\n"
                           "pools:\n  - {name: prefill, replicas: 1}\n  - {name: decode, replicas: 4}\n")
    summary, table = replay(cli, constant_rate(write, "pd.csv", 50, 40, prompt=8000, output=10), cfg, "pd")
    prefill, decode = summary["pools"]["prefill"]["saturation"], summary["pools"]["decode"]["saturation"]
    assert prefill["class"] == "overloaded", prefill
    assert prefill["arrival_rate_per_s"] > 2 * prefill["completion_rate_per_s"]
    assert decode["class"] == "stable", decode
    assert "overloaded" in table and "stable" in table
