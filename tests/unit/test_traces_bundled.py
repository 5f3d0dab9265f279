"""The bundled traces load fast and reproduce shared/traces/README.md's statistics."""

from __future__ import annotations

import hashlib
import time

import pytest

from common.errors import TraceError
from traces import BUNDLED, DEFAULT_TRACE, bundled_trace_path, inspect_trace, load_trace

# rows, span_s, prompt mean/median/p99/min/max, output mean/median/p99/min/max, peak 1-min, sha256
README = {
    "azure-code-2023": (8_819, 3435.9, (2047.8, 1469, 7436, 3, 7437), (27.9, 13, 252, 6, 1899), 723,
                        "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6"),
    "azure-conv-2023": (19_366, 3501.7, (1154.7, 1020, 4142, 2, 14050), (211.1, 129, 601, 7, 1000), 522,
                        "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8"),
    "mooncake-synthetic": (3_993, 1022.0, (15325.5, 11587, 66458, 13, 191378), (149.1, 69, 769, 1, 893),
                           280, "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131"),
}  # fmt: skip
MEAN_RATE = {"azure-code-2023": 2.57, "azure-conv-2023": 5.53, "mooncake-synthetic": 3.91}


@pytest.fixture(scope="module")
def loaded():
    return {name: load_trace(name) for name in BUNDLED}


def test_names():
    assert DEFAULT_TRACE == "azure-conv-2023"
    assert set(BUNDLED) == set(README)
    for name in BUNDLED:
        assert bundled_trace_path(name).is_file()
    with pytest.raises(TraceError, match="known: azure-code-2023"):
        bundled_trace_path("nope")


@pytest.mark.parametrize("name", sorted(README))
def test_statistics_match_the_shared_readme(loaded, name):
    rows, span, prompt, output, peak, sha = README[name]
    trace = loaded[name]
    info = inspect_trace(trace)
    assert trace.sha256 == sha == hashlib.sha256(bundled_trace_path(name).read_bytes()).hexdigest()
    assert trace.reordered == 0 and trace.dropped == {}
    assert info["rows"] == rows
    assert info["span_s"] == pytest.approx(span, abs=0.05)
    assert info["mean_rate_rps"] == pytest.approx(MEAN_RATE[name], abs=0.005)
    assert info["peak_1min_requests"] == peak
    assert info["peak_1min_rps"] == pytest.approx(peak / 60)
    pairs = ((info["prompt_tokens"], prompt), (info["output_tokens"], output))
    for stats, (mean, p50, p99, low, high) in pairs:
        assert stats["mean"] == pytest.approx(mean, abs=0.05)
        assert (stats["p50"], stats["p99"], stats["min"], stats["max"]) == (p50, p99, low, high)


def test_exact_spans_and_sums(loaded):
    conv = loaded["azure-conv-2023"].frame
    assert conv["arrival_us"].max() == 3_501_721_937  # 18:15:46.6805900 -> 19:14:08.4025270
    assert conv["arrival_us"][0] == 0
    code = loaded["azure-code-2023"].frame
    assert code["arrival_us"].max() == 3_435_948_056
    moon = loaded["mooncake-synthetic"].frame
    assert moon["arrival_us"].max() == 1_022_025_000
    assert moon["prefix_hashes"].list.len().sum() == 121_877


def test_mooncake_prefix_reuse_matches_readme(loaded):
    reuse = inspect_trace(loaded["mooncake-synthetic"])["prefix_reuse"]
    assert reuse["block_references"] == 121_877
    assert reuse["unique_blocks"] == 43_924
    assert round(100 * reuse["reused_block_fraction"], 2) == 63.96
    assert round(100 * reuse["reused_prompt_token_fraction"], 2) == 65.12


def test_labels(loaded):
    assert set(loaded["azure-conv-2023"].frame["workload"]) == {"conv"}
    assert set(loaded["azure-code-2023"].frame["workload"]) == {"code"}
    assert set(loaded["mooncake-synthetic"].frame["workload"]) == {"mooncake"}
    assert loaded["mooncake-synthetic"].prefix_block_tokens == 512
    assert loaded["azure-conv-2023"].source == "azure-conv-2023"


def test_default_trace_loads_well_under_a_second():
    load_trace(DEFAULT_TRACE)  # warm imports and caches
    start = time.perf_counter()
    load_trace(DEFAULT_TRACE)
    assert time.perf_counter() - start < 0.5


def test_bundle_has_licences_and_readme():
    data = bundled_trace_path(DEFAULT_TRACE).parent
    readme = (data / "README.md").read_text()
    for needle in ("Splitwise", "ISCA 2024", "Mooncake", "FAST 2025", "CC-BY 4.0", "Apache-2.0",
                   "b469a113cedca53ddc3bdea71a143dc4b7d8700c", "3b5a594133958449a1feaf1c9e0fc1b553e34a28"):
        assert needle in readme
    for _, (*_, sha) in README.items():
        assert sha in readme
    azure = (data / "LICENSE-AZURE-CC-BY-4.0").read_text(encoding="utf-8-sig")
    assert "Attribution 4.0 International" in azure
    assert "Apache License" in (data / "LICENSE-MOONCAKE-APACHE-2.0").read_text()
