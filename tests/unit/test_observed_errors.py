"""Bad observed input is one line naming the file, the series and what was expected."""

from __future__ import annotations

import json

import pytest

from tests.observed_files import prom_json, write_json
from common.errors import ConfigError, UserError
from traces.observed import ObservedConfig, ObservedLimits, read_observed, select

T0 = 1_700_000_000.0
WAITING = ("vllm:num_requests_waiting", {"pool": "chat"}, [(T0, 1.0), (T0 + 15, 2.0)])


def _error(tmp_path, name: str, text: str | bytes, limits: ObservedLimits | None = None) -> str:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(UserError) as info:
        read_observed([path], **({"limits": limits} if limits else {}))
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path))
    return message


@pytest.mark.parametrize("text, expected", [
    ("hello world\nthis is not metrics\n", "not one of the observed-metrics formats"),
    (b"\xff\xfe\x00garbage", "not UTF-8"),
    ('{"foo": 1}', "not a Prometheus query_range response"),
    ('{"status": "success", "data": {"resultType": "vector", "result": []}}', 'resultType \'vector\', expected "matrix"'),
    ('{"status": "error", "errorType": "bad_data", "error": "parse error"}', "the query failed (bad_data: parse error)"),
    ('{"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {"pod": "a"}, "values": [[1, "1"]]}]}}',
     "has no __name__"),
    ('{"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {"__name__": "vllm:num_requests_waiting", "pod": "a"}, "values": [[1, "many"]]}]}}',
     "vllm:num_requests_waiting{pod=\"a\"}: values[0] has value 'many', expected a number"),
])
def test_files_that_are_not_readable_metrics(tmp_path, text, expected):
    assert expected in _error(tmp_path, "obs.json", text)


@pytest.mark.parametrize("text, expected", [
    ('vllm:num_requests_waiting{pod="a"} lots 1700000000\n', "value 'lots' is not a number"),
    ('vllm:num_requests_waiting{pod="a"} 3\n', "has no timestamp"),
    ('vllm:num_requests_waiting{pod="a"} 3 1700000000000\n', "looks like milliseconds"),
    ('vllm:num_requests_waiting{pod="a"} 3 1700000000\n# EOF\nvllm:num_requests_waiting 1 1\n', "text after '# EOF'"),
    ('vllm:num_requests_waiting{pod=a} 3 1700000000\n', "labels not of the form"),
])
def test_openmetrics_mistakes(tmp_path, text, expected):
    assert expected in _error(tmp_path, "obs.om", text)


def test_csv_mistakes(tmp_path):
    message = _error(tmp_path, "g.csv", 'Time,"vllm:num_requests_waiting{pod=""a""}"\n1700000000000,12 req\n')
    assert "row 2, column 'vllm:num_requests_waiting{pod=\"a\"}': '12 req' is not a number" in message
    assert "is neither epoch seconds" in _error(tmp_path, "t.csv", "Time,vllm:num_requests_waiting\nyesterday,1\n")
    assert "does not name a series" in _error(tmp_path, "h.csv", 'Time,"rate(x[5m])"\n1,1\n')


def test_no_known_metric_lists_the_names_found(tmp_path):
    text = json.dumps(prom_json([("node_load1", {}, [(T0, 1.0)]), ("up", {"job": "x"}, [(T0, 1.0)])]))
    message = _error(tmp_path, "o.json", text)
    assert "no series of a metric this tool knows; found node_load1, up" in message


def _buckets(counts: dict[str, float]):
    return [("vllm:e2e_request_latency_seconds_bucket", {"pool": "chat", "le": le}, [(T0, c)]) for le, c in counts.items()]


def test_histogram_buckets_must_be_cumulative_and_complete(tmp_path):
    message = _error(tmp_path, "h.json", json.dumps(prom_json(_buckets({"0.5": 5, "1": 3, "+Inf": 6}))))
    assert 'histogram vllm:e2e_request_latency_seconds_bucket{pool="chat"}: bucket le="1" counts 3' in message
    assert "less than le=\"0.5\"'s 5: expected cumulative buckets" in message
    message = _error(tmp_path, "i.json", json.dumps(prom_json(_buckets({"0.5": 1, "1": 3}))))
    assert 'has no le="+Inf" bucket' in message
    message = _error(tmp_path, "j.json", json.dumps(prom_json(_buckets({"big": 1, "+Inf": 3}))))
    assert "needs a numeric le label" in message


def test_a_series_that_maps_to_no_pool_names_itself_and_the_pools(tmp_path):
    observed = read_observed([write_json(tmp_path / "o.json", [("vllm:num_requests_running", {"pod": "search-5f6d7c8b9-aaaaa", "model_name": "m"}, [(T0, 1.0)])])])
    with pytest.raises(UserError) as info:
        select(observed, ObservedConfig(), ["chat", "batch"], (0.0, 60.0), T0)
    assert str(info.value) == (f"{tmp_path / 'o.json'}: series vllm:num_requests_running{{model_name=\"m\", "
                               f"pod=\"search-5f6d7c8b9-aaaaa\"}} maps to no pool (pool_label pool, deployment, pod, "
                               f"model_name: pod=\"search-5f6d7c8b9-aaaaa\", model_name=\"m\"); expected one of the "
                               f"pools chat, batch, or an entry in observed.pools")


def test_timestamps_outside_the_trace_window(tmp_path):
    observed = read_observed([write_json(tmp_path / "o.json", [WAITING])])
    with pytest.raises(UserError) as info:
        select(observed, ObservedConfig(), ["chat"], (0.0, 600.0), T0 + 86_400)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'o.json'}: series vllm:num_requests_waiting (pool chat, replica -)")
    assert "samples from 2023-11-14T22:13:20Z to 2023-11-14T22:13:35Z, none within the trace's window" in message


def test_the_time_mapping_and_the_pools_must_make_sense(tmp_path):
    observed = read_observed([write_json(tmp_path / "o.json", [WAITING])])
    with pytest.raises(ConfigError, match="observed.offset_s: null and the trace has no wall-clock"):
        select(observed, ObservedConfig(), ["chat"], (0.0, 60.0), None)
    with pytest.raises(ConfigError, match=r"observed.pools.llama: 'chta' is not a pool of the fleet \(pools: chat\)"):
        select(observed, ObservedConfig(pools={"llama": "chta"}), ["chat"], (0.0, 60.0), T0)


@pytest.mark.parametrize("limits, expected", [
    (ObservedLimits(max_bytes=100), "bytes, more than the 100 a observed metrics file may hold"),
    (ObservedLimits(max_series=1), "more than 1 series"),
    (ObservedLimits(max_samples=3), "more than 3 samples"),
    (ObservedLimits(max_labels=1), "has 2 labels, more than the 1 a series may have"),
    (ObservedLimits(max_label_bytes=4), "a label name or value of"),
])
def test_the_bounds(tmp_path, limits, expected):
    series = [("vllm:num_requests_waiting", {"pool": "chat", "pod": "p"}, [(T0, 1.0), (T0 + 1, 2.0)]),
              ("vllm:num_requests_running", {"pool": "chat"}, [(T0, 1.0), (T0 + 1, 2.0)])]
    assert expected in _error(tmp_path, "o.json", json.dumps(prom_json(series)), limits)


def test_more_files_than_allowed_and_a_missing_file(tmp_path):
    with pytest.raises(UserError, match="3 observed-metrics files, more than the 2"):
        read_observed(["a", "b", "c"], ObservedLimits(max_files=2))
    with pytest.raises(UserError, match="observed metrics file not found"):
        read_observed([tmp_path / "missing.json"])


def test_the_config_section_names_unknown_keys_and_out_of_range_values():
    with pytest.raises(ConfigError, match=r"unknown key 'observed.replica_lable' \(did you mean 'replica_label'\?\)"):
        ObservedConfig.from_mapping({"replica_lable": "pod"})
    with pytest.raises(ConfigError, match=r"observed.offset_s: got 100000000000.0, expected >= 0 and <= 4.1e\+09 \(Unix seconds\)"):
        ObservedConfig.from_mapping({"offset_s": 1e11})
    with pytest.raises(ConfigError, match="observed.window_s: got 0.0, expected seconds > 0"):
        ObservedConfig.from_mapping({"window_s": 0})
    config = ObservedConfig.from_mapping({"pool_label": "deployment", "pools": {"vllm-chat": "chat"}, "offset_s": 1.7e9})
    assert config.pool_label == ("deployment",) and config.replica_label == ("replica", "pod", "instance")
    assert ObservedConfig.from_mapping(None) == ObservedConfig()
