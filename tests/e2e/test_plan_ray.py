"""`plan --backend ray` on a real local Ray cluster finds the answer the local workers find."""

from __future__ import annotations

import json

import pytest

from tests.e2e.test_plan_cli import two_pools  # noqa: F401  (the fixture)

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'llm-replay[ray]')")


def test_ray_finds_the_local_answer(cli, two_pools, cluster):  # noqa: F811
    args = [*two_pools, "--gpu", "h100-sxm-80gb", "--tp", "1,2", "--json"]
    local = cli("plan", *args, "--workers", "1")
    on_ray = cli("plan", *args, "--backend", "ray", "--workers", "2")
    assert local.code == on_ray.code == 0, on_ray.err
    assert "2 workers on Ray" in on_ray.err
    a, b = json.loads(local.out), json.loads(on_ray.out)
    for key in ("winner", "candidates", "frontier", "replays"):
        assert a[key] == b[key], key
    assert ray.is_initialized()  # a cluster the test started is the test's to shut down


def test_a_candidate_that_fails_on_ray_is_named(cli, two_pools, write, cluster):  # noqa: F811
    # llama-3.1-70b does not fit one H100 at BF16: that candidate is listed with its reason.
    write("big.yaml", "model: llama-3.1-70b\ngpu: h100-sxm-80gb\npools:\n"
                      "  - {name: chat, workloads: [chat], replicas: 1}\n"
                      "  - {name: batch, workloads: [batch], replicas: 1}\n")
    args = [a if a != "fleet.yaml" else "big.yaml" for a in two_pools]
    got = cli("plan", *args, "--gpu", "h100-sxm-80gb", "--tp", "1,4", "--backend", "ray", "--json")
    assert got.code in (0, 1), got.err
    plan = json.loads(got.out)
    tp1 = next(c for c in plan["candidates"] if c["tensor_parallel_size"] == 1)
    assert tp1["problem"] and "fit" in tp1["problem"]


def test_address_needs_the_ray_backend(cli, two_pools):  # noqa: F811
    got = cli("plan", *two_pools, "--address", "127.0.0.1:1")
    assert got.code == 2 and got.err.strip() == "llm-replay: error: plan: --address: only with --backend ray"


def test_an_unreachable_head_is_one_line(cli, two_pools):  # noqa: F811
    got = cli("plan", *two_pools, "--backend", "ray", "--address", "127.0.0.1:1")
    assert got.code == 2 and "no Ray cluster answers there" in got.err and len(got.err.strip().splitlines()) == 1
