"""Reading observed metrics: each format, detected from the content, into one tidy frame; the
same samples read the same in every format; unknown metrics listed, not dropped."""

from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
import pytest
from hypothesis import given, strategies as st

from tests.observed_files import write_csv_long, write_csv_wide, write_json, write_openmetrics
from traces.observed import detect, read_observed, read_one

T0 = 1_700_000_000.0
WAITING = ("vllm:num_requests_waiting", {"pod": "chat-7f9c6d5b4-abcde", "model_name": "m"},
           [(T0, 3.0), (T0 + 15, 4.0), (T0 + 30, 0.0)])
TOKENS = ("vllm:generation_tokens_total", {"pod": "chat-7f9c6d5b4-abcde"}, [(T0, 10.0), (T0 + 15, 25.5)])


def _rows(frame: pl.DataFrame) -> list[tuple]:
    return sorted((r["metric"], tuple(sorted((k, v) for k, v in r["labels"].items() if v is not None)), r["t"], r["value"])
                  for r in frame.iter_rows(named=True))


@pytest.mark.parametrize("writer", [write_json, write_openmetrics, write_csv_long, write_csv_wide])
def test_each_format_reads_the_same_samples(tmp_path, writer):
    frame = read_one(writer(tmp_path / "obs.data", [WAITING, TOKENS]))
    assert frame.columns == ["metric", "labels", "t", "value"]
    assert frame.schema["t"] == pl.Float64 and frame.schema["value"] == pl.Float64
    expected = [(m, tuple(sorted(labels.items())), t, v) for m, labels, points in (WAITING, TOKENS) for t, v in points]
    assert _rows(frame) == sorted(expected)


def test_the_format_is_found_from_the_content_not_the_name(tmp_path):
    path = write_json(tmp_path / "looks-like.csv", [WAITING])
    assert detect(path.read_text()) == "prometheus-json"
    assert read_one(path).height == 3


def test_several_queries_in_one_file(tmp_path):
    from tests.observed_files import prom_json
    one, two = prom_json([WAITING]), prom_json([TOKENS])
    for text in (json.dumps([one, two]), json.dumps({"vllm:num_requests_waiting": one, "tokens": two}),
                 json.dumps(one) + "\n" + json.dumps(two) + "\n"):
        (tmp_path / "q.json").write_text(text)
        assert _rows(read_one(tmp_path / "q.json")) == _rows(read_one(write_json(tmp_path / "both.json", [WAITING, TOKENS])))


def test_grafana_csv_with_iso_times_and_an_excel_separator_line(tmp_path):
    path = tmp_path / "grafana.csv"
    path.write_text('sep=;\n"Time";"vllm:num_requests_running{pod=""a-5d8f7c9b4-zzzzz""}";"{__name__=""vllm:num_requests_waiting"", pod=""a-5d8f7c9b4-zzzzz""}"\n'
                    "2023-11-14 22:13:20;5;\n2023-11-14T22:13:35+00:00;6;2\n")
    frame = read_one(path)
    assert _rows(frame) == [
        ("vllm:num_requests_running", (("pod", "a-5d8f7c9b4-zzzzz"),), T0, 5.0),
        ("vllm:num_requests_running", (("pod", "a-5d8f7c9b4-zzzzz"),), T0 + 15, 6.0),
        ("vllm:num_requests_waiting", (("pod", "a-5d8f7c9b4-zzzzz"),), T0 + 15, 2.0),
    ]


def test_long_csv_with_labels_as_columns(tmp_path):
    path = tmp_path / "long.csv"
    path.write_text("timestamp,__name__,deployment,namespace,value\n"
                    f"{T0},kube_deployment_status_replicas,chat,prod,3\n{T0 + 60},kube_deployment_status_replicas,chat,prod,4\n")
    assert _rows(read_one(path)) == [
        ("kube_deployment_status_replicas", (("deployment", "chat"), ("namespace", "prod")), T0, 3.0),
        ("kube_deployment_status_replicas", (("deployment", "chat"), ("namespace", "prod")), T0 + 60, 4.0),
    ]


def test_openmetrics_descriptors_histograms_exemplars_and_escapes(tmp_path):
    path = tmp_path / "vllm.om"
    path.write_text(
        "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.\n"
        "# TYPE vllm:time_to_first_token_seconds histogram\n# UNIT vllm:time_to_first_token_seconds seconds\n"
        f'vllm:time_to_first_token_seconds_bucket{{le="0.5",model_name="a \\"b\\"",}} 2 {T0} # {{trace_id="x"}} 0.3 {T0}\n'
        f'vllm:time_to_first_token_seconds_bucket{{le="+Inf",model_name="a \\"b\\""}} 3 {T0}\n'
        f'vllm:time_to_first_token_seconds_count{{model_name="a \\"b\\""}} 3 {T0}\n# EOF\n')
    frame = read_one(path)
    assert frame["metric"].to_list() == ["vllm:time_to_first_token_seconds_bucket"] * 2 + ["vllm:time_to_first_token_seconds_count"]
    assert set(frame["labels"].struct.field("model_name").to_list()) == {'a "b"'}
    assert frame["value"].to_list() == [2.0, 3.0, 3.0]


def test_a_partial_match_lists_the_unknown_names(tmp_path):
    other = ("process_cpu_seconds_total", {"job": "vllm"}, [(T0, 1.0)])
    observed = read_observed([write_json(tmp_path / "a.json", [WAITING, other, TOKENS])])
    assert observed.unknown == ("process_cpu_seconds_total",)
    assert set(observed.series["metric"]) == {"vllm:num_requests_waiting", "vllm:generation_tokens_total",
                                              "process_cpu_seconds_total"}


def test_a_series_in_two_files_is_one_series(tmp_path):
    first = (WAITING[0], WAITING[1], WAITING[2][:2])
    second = (WAITING[0], WAITING[1], WAITING[2][1:])
    observed = read_observed([write_json(tmp_path / "a.json", [first]), write_openmetrics(tmp_path / "b.om", [second])])
    assert observed.series.height == 1
    assert observed.samples["t"].to_list() == [t for t, _ in WAITING[2]]


# The same samples through every writer: CSV, JSON and OpenMetrics read one frame.
_label = st.text(alphabet="abcxyz-_.\"\\ 0123", min_size=1, max_size=6)
_values = st.one_of(st.integers(-10**6, 10**6).map(float), st.floats(-1e6, 1e6, allow_nan=False, width=32).map(float))


@st.composite
def _series_sets(draw):
    names = draw(st.lists(st.sampled_from(["vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                                           "vllm:prompt_tokens_total", "DCGM_FI_DEV_GPU_UTIL"]),
                          min_size=1, max_size=3, unique=True))
    out = []
    for name in names:
        labels = draw(st.dictionaries(st.sampled_from(["pod", "model_name", "gpu"]), _label, max_size=2))
        gaps = draw(st.lists(st.integers(1, 30_000), min_size=1, max_size=5))
        times = T0 + np.cumsum(gaps) / 1000.0  # whole milliseconds, as Grafana's export keeps them
        out.append((name, labels, [(float(t), draw(_values)) for t in times]))
    return out


@given(series=_series_sets())
def test_every_format_reads_the_same_frame(tmp_path_factory, series):
    tmp = tmp_path_factory.mktemp("same")
    frames = [_rows(read_one(w(tmp / f"obs{i}", series)))
              for i, w in enumerate((write_json, write_openmetrics, write_csv_long, write_csv_wide))]
    for other in frames[1:]:
        assert len(other) == len(frames[0])
        for a, b in zip(frames[0], other):
            assert a[:2] == b[:2] and math.isclose(a[2], b[2], abs_tol=1e-6) and a[3] == b[3]
