"""`llm-replay calibrate --observed`: an export of a replay of the "true" fleet, read against a
config that differs from it, gives back the keys that differ, and applying them closes the gap;
bad input is one line, exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

START = "2024-12-01T11:00:00Z"
OBSERVED = "observed: {offset_s: 1733050800, window_s: 30, rate_window_s: 30}\n"
TRACE = "trace: {path: azure-conv-2023, window: {end_s: 240}, rate_scale: 2}\n"
FIXED = ("model: llama-3.1-8b\n" + TRACE + OBSERVED).replace("{", "{{").replace("}", "}}") \
    + "pools:\n  - {{name: chat, replicas: {n}{engine}}}\n"
SCALED = """model: llama-3.1-8b
trace: {{path: azure-conv-2023, window: {{end_s: 1800}}, rate_scale: 6}}
{observed}pools:
  - name: chat
    replicas: {n}
    autoscaler: {{policy: queue-depth, min_replicas: {lo}, max_replicas: {hi}}}
    lifecycle: {{pod_start_s: 20, load_bytes_per_s: 4.0e9}}
"""


def _export(cli, config: Path, out: str, blocks: int | None = None, step: str | None = None) -> Path:
    """Replay `config`, export it as OpenMetrics; with `blocks`, add vLLM's cache_config_info as a
    vLLM server exposes it (a gauge of value 1 whose labels are the cache config)."""
    assert cli("run", "-c", config, "-o", out, "-q").code == 0
    om = Path(out + ".om")
    res = cli("export", out, "--format", "openmetrics", "-o", om, "--start", START, *(["--step", step] if step else []))
    assert res.code == 0, res.err
    if blocks is not None:
        lines = om.read_text().splitlines()
        stamps = [line.rsplit(" ", 1)[1] for line in lines if line.startswith("kube_deployment_status_replicas{")]
        info = ["# TYPE vllm:cache_config_info gauge"] + [
            f'vllm:cache_config_info{{block_size="16",num_gpu_blocks="{blocks}",pool="chat"}} 1 {t}' for t in stamps]
        om.write_text("\n".join(lines[:-1] + info + lines[-1:]) + "\n")
    return om


def _calibrate(cli, config: Path, *observed: Path):
    res = cli("calibrate", "--config", config, "--out", "keys.yaml", "--json", "--observed", *observed)
    assert res.code == 0, res.err
    return json.loads(res.out)


def test_the_kv_blocks_and_replicas_an_export_pins_are_found_and_close_the_gap(cli, write):
    truth = _export(cli, write("truth.yaml", FIXED.format(n=2, engine=", engine: {num_gpu_blocks_override: 3000, max_model_len: 16384}")),
                    "truth", blocks=3000)
    doc = _calibrate(cli, write("guess.yaml", FIXED.format(n=1, engine=", engine: {max_model_len: 16384}")), truth)
    assert doc["suggested"] == {"pools[0].replicas": 2, "pools[0].engine.num_gpu_blocks_override": 3000}
    mape = doc["mape"]
    assert mape["replicas"]["chat"] == {"before": pytest.approx(0.5), "after": 0.0}
    for signal in ("kv_usage", "running", "gpu_busy"):
        assert mape[signal]["chat"]["after"] < mape[signal]["chat"]["before"], (signal, mape[signal])
    # the file holds the keys as YAML to merge into the config
    keys = yaml.safe_load(Path("keys.yaml").read_text())
    assert keys == {"pools": [{"name": "chat", "replicas": 2, "engine": {"num_gpu_blocks_override": 3000}}]}
    # the human form prints the same YAML and the table
    res = cli("calibrate", "--config", "guess.yaml", "--out", "keys.yaml", "--force", "--observed", truth)
    assert res.code == 0, res.err
    assert "num_gpu_blocks_override: 3000" in res.out and "before" in res.out and "after" in res.out


def test_a_matching_config_is_told_so(cli, write):
    truth = _export(cli, write("truth.yaml", FIXED.format(n=1, engine="")), "truth")
    doc = _calibrate(cli, Path("truth.yaml"), truth)
    assert doc["suggested"] == {}
    assert all(m["before"] == m["after"] for pools in doc["mape"].values() for m in pools.values())
    assert doc["mape"]["replicas"]["chat"]["before"] == 0.0


def test_an_autoscaled_export_pins_the_bounds_and_the_timing_is_reported(cli, write):
    truth = _export(cli, write("truth.yaml", SCALED.format(observed=OBSERVED, n=1, lo=1, hi=4)), "truth")
    doc = _calibrate(cli, write("guess.yaml", SCALED.format(observed=OBSERVED, n=2, lo=2, hi=3)), truth)
    assert doc["suggested"] == {"pools[0].replicas": 1, "pools[0].autoscaler.min_replicas": 1,
                                "pools[0].autoscaler.max_replicas": 4}
    assert doc["mape"]["replicas"]["chat"]["after"] == 0.0 < doc["mape"]["replicas"]["chat"]["before"]
    timing = [n for n in doc["notes"] if "first changed" in n]
    assert len(timing) == 1 and "s later" in timing[0], doc["notes"]


def test_a_rate_window_shorter_than_two_scrapes_is_widened(cli, write):
    truth = _export(cli, write("truth.yaml", FIXED.format(n=1, engine="").replace("rate_window_s: 30", "rate_window_s: 15")),
                    "truth", step="10")
    doc = _calibrate(cli, Path("truth.yaml"), truth)
    assert doc["suggested"] == {"observed.rate_window_s": 40.0}
    assert doc["mape"]["output_tokens_per_s"]["chat"]["after"] is not None


@pytest.mark.parametrize("argv, message", [
    (["--model", "llama-3.1-8b"], "calibrate --observed: fits the fleet config to an observed export, so it takes no --model"),
    (["--experiments", "x"], "so it takes no --experiments"),
])
def test_step_time_flags_are_refused(cli, write, argv, message):
    write("gauges.json", '{"status": "success", "data": {"resultType": "matrix", "result": []}}')
    res = cli("calibrate", *argv, "--out", "k.yaml", "--observed", "gauges.json")
    assert res.code == 2 and message in res.err and len(res.err.strip().splitlines()) == 1, res.err
    assert not Path("k.yaml").exists()


def test_an_export_that_pins_nothing_is_one_line(cli, write):
    write("f.yaml", FIXED.format(n=1, engine=""))
    series = {"metric": {"__name__": "vllm:num_requests_waiting", "pool": "chat"},
              "values": [[1733050800 + s, "0"] for s in range(0, 240, 10)]}
    write("waiting.json", json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [series]}}))
    res = cli("calibrate", "--config", "f.yaml", "--out", "k.yaml", "--observed", "waiting.json")
    assert res.code == 2, res.err
    assert res.err.strip() == ("llm-replay: error: waiting.json: no series that pins a config key (expected "
                               "vllm:cache_config_info or kube_deployment_status_replicas; found "
                               "vllm:num_requests_waiting)")
    assert not Path("k.yaml").exists()


def test_config_without_observed_is_refused(cli, write):
    write("f.yaml", FIXED.format(n=1, engine=""))
    res = cli("calibrate", "p.csv", "--config", "f.yaml", "--out", "k.yaml")
    assert res.code == 2 and "calibrate --config: applies with --observed" in res.err


def test_the_shipped_example_gives_back_what_the_incident_ran(cli):
    """README's post-mortem: first-guess.yaml says two replicas and a smaller KV cache than the
    fleet incident.json was exported from (make_incident.py); calibrate reads both back."""
    here = Path(__file__).resolve().parents[1] / "fixtures" / "observed"
    doc = _calibrate(cli, here / "first-guess.yaml", here / "incident.json")
    blocks = json.loads((here / "incident.json").read_text())
    info = next(s for s in blocks["data"]["result"] if s["metric"]["__name__"] == "vllm:cache_config_info")
    assert doc["suggested"] == {"pools[0].engine.num_gpu_blocks_override": int(info["metric"]["num_gpu_blocks"]),
                                "pools[0].replicas": 1}
    assert doc["mape"]["replicas"]["chat"] == {"before": 1.0, "after": 0.0}
    assert doc["mape"]["gpu_busy"]["chat"]["after"] < doc["mape"]["gpu_busy"]["chat"]["before"]
