"""What-ifs of the trace section (traces/whatif.py, issue 14 item 1): rates scaled per workload
or in a burst, prompts grown, a tenant added, with fresh prefix namespaces for what is added."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from common.configtools import from_dict
from common.errors import ConfigError, TraceError
from traces import TraceConfig, load_from_config


def _load(**trace):
    return load_from_config(from_dict(TraceConfig, trace, "trace", "c.yaml"))


def _ids(frame: pl.DataFrame) -> set[int]:
    return set(frame["prefix_hashes"].explode().drop_nulls().to_list())


def test_scaling_one_workload_leaves_the_others_and_the_duration():
    base = _load(path="azure-conv-2023", merge=[{"path": "azure-code-2023"}])
    scaled = _load(path="azure-conv-2023", merge=[{"path": "azure-code-2023"}],
                   whatif={"scale_workload": {"code": 2.0}})
    count = dict(base.frame.group_by("workload").len().iter_rows())
    after = dict(scaled.frame.group_by("workload").len().iter_rows())
    assert after["conv"] == count["conv"] and after["code"] == pytest.approx(2 * count["code"], rel=0.03)
    span = lambda f: f["arrival_us"].max() - f["arrival_us"].min()  # noqa: E731
    assert span(scaled.frame) <= span(base.frame) * 1.01
    halved = _load(path="azure-conv-2023", whatif={"grow_rate": 0.5}).frame
    assert halved.height == pytest.approx(base.frame.filter(pl.col("workload") == "conv").height / 2, rel=0.05)


def test_added_requests_get_a_fresh_prefix_namespace():
    base = _load(path="mooncake-synthetic").frame
    grown = _load(path="mooncake-synthetic", whatif={"grow_rate": 2.0}).frame
    assert grown.height == pytest.approx(2 * base.height, rel=0.05)
    added = grown.filter(~pl.col("prefix_hashes").is_in(base["prefix_hashes"].implode()))
    assert added.height >= base.height * 0.9
    assert not (_ids(added) & _ids(base))  # never the recorded trace's own block ids
    assert np.all(np.diff(grown["arrival_us"].to_numpy()) >= 0) and grown["request_id"].to_list() == list(range(grown.height))


def test_a_burst_adds_requests_only_inside_its_window():
    base = _load(path="azure-conv-2023").frame
    burst = _load(path="azure-conv-2023", whatif={"burst": {"at_s": 600, "duration_s": 60, "factor": 3}}).frame
    inside = lambda f: f.filter(pl.col("arrival_us").is_between(600_000_000, 660_000_000, closed="left")).height  # noqa: E731
    assert inside(burst) == pytest.approx(3 * inside(base), rel=0.1)
    assert burst.height - inside(burst) == base.height - inside(base)
    with pytest.raises(TraceError, match="trace.whatif.burst: no request arrives in"):
        _load(path="azure-conv-2023", whatif={"burst": {"at_s": 1e6, "duration_s": 60, "factor": 3}})


def test_growing_prompts_extends_their_hash_lists():
    base = _load(path="mooncake-synthetic").frame
    grown = _load(path="mooncake-synthetic", whatif={"grow_prompts": 1.5}).frame
    assert (grown["prompt_tokens"] >= base["prompt_tokens"]).all()
    old, new = base["prefix_hashes"].to_list(), grown["prefix_hashes"].to_list()
    for i in range(0, len(old), 97):
        assert new[i][: len(old[i])] == old[i] and len(new[i]) == -(-grown["prompt_tokens"][i] // 512)


def test_adding_a_tenant_merges_a_synth_spec_over_the_trace_span():
    tenant = {"workloads": [{"name": "newco", "tenant": "newco", "arrival": {"process": "poisson", "rate": 1},
                             "prompt": {"dist": "constant", "value": 2048}, "output": {"dist": "constant", "value": 8},
                             "system_prompt": {"tokens": 1024}}]}
    base = _load(path="mooncake-synthetic").frame
    trace = _load(path="mooncake-synthetic", whatif={"add_tenant": tenant})
    new = trace.frame.filter(pl.col("tenant") == "newco")
    span_s = (base["arrival_us"].max() - base["arrival_us"].min()) / 1e6
    assert new.height == pytest.approx(span_s, rel=0.15) and trace.frame.height == base.height + new.height
    assert trace.prefix_block_tokens == 512 and not (_ids(new) & _ids(base))
    assert not trace.notes  # fresh hashes: no shared-hash warning
    with pytest.raises(TraceError, match="prefix_block_tokens=16, expected the trace's 512"):
        _load(path="mooncake-synthetic", whatif={"add_tenant": {**tenant, "prefix_block_tokens": 16}})


def test_a_merge_that_repeats_a_traces_hashes_warns_once_with_the_count():
    trace = _load(path="mooncake-synthetic", merge=[{"path": "mooncake-synthetic", "workload": "again"}])
    assert len(trace.notes) == 1 and "(the same file twice) share" in trace.notes[0]


@pytest.mark.parametrize(("whatif", "message"), [
    ({"scale_workload": {"nope": 2}}, "trace.whatif.scale_workload.nope: no request of workload 'nope'"),
    ({"grow_rate": -1}, "trace.whatif.grow_rate: got -1.0, expected"),
    ({"grow_rat": 2}, "unknown key 'trace.whatif.grow_rat' (did you mean 'grow_rate'?)"),
])
def test_bad_whatifs_name_the_key(whatif, message):
    with pytest.raises((ConfigError, TraceError)) as err:
        _load(path="azure-conv-2023", whatif=whatif)
    assert message in str(err.value)
