"""`llm-replay run --observed` and `validate RUN --observed` end to end: an export written from a
run's own ticks scores zero, a gap put into it is found where it was put, and every bad input
of issue 13 is one line, exit 2, no run directory."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tests.e2e.conftest import read_run, small_fleet

OFFSET = 1_700_000_000  # the wall time of the trace's time 0 in these exports
OBSERVED = f"observed: {{offset_s: {OFFSET}, window_s: 20, rate_window_s: 20}}\n"
TRACE = "{path: azure-conv-2023, window: {end_s: 120}}"
# gauge -> (metric name, label naming the pool, ticks column or sum of columns, scale to the metric's unit)
GAUGES = {
    "waiting": ("vllm:num_requests_waiting", "pool", ["waiting"], 1),
    "running": ("vllm:num_requests_running", "pool", ["running"], 1),
    "kv_usage": ("vllm:kv_cache_usage_perc", "pool", ["kv_usage"], 1),
    "gpu_busy": ("DCGM_FI_DEV_GPU_UTIL", "pool", ["gpu_busy"], 100),
    "replicas": ("kube_deployment_status_replicas", "deployment",
                 ["replicas_active", "replicas_loading"], 1),
}


def export_of(ticks: pl.DataFrame, path: Path, extra: int = 0, between: tuple[float, float] = (0, 0)) -> Path:
    """A Prometheus query_range response of the run's gauges, as a scrape once per tick would
    have recorded them; `extra` added to vllm:num_requests_waiting for ticks in `between` (s)."""
    result = []
    for (pool,), g in ticks.sort("t_us").group_by("pool", maintain_order=True):
        t = (g["t_us"] / 1e6).to_list()
        for signal, (name, label, columns, scale) in GAUGES.items():
            values = g.select(pl.sum_horizontal(columns) * scale).to_series().to_list()
            if signal == "waiting":
                values = [v + extra if between[0] <= s <= between[1] else v for s, v in zip(t, values)]
            result.append({"metric": {"__name__": name, label: pool, "instance": "10.0.0.1:8000"},
                           "values": [[OFFSET + s, repr(float(v))] for s, v in zip(t, values)]})
    path.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}))
    return path


@pytest.fixture
def replayed(cli, write):
    """A run of a small fleet whose config has an `observed:` section, and its tick frame."""
    cfg = write("fleet.yaml", small_fleet(TRACE, extra=OBSERVED))
    assert cli("run", "-c", cfg, "-o", "plain", "-q").code == 0
    return cfg, read_run(Path("plain"))


def test_an_export_of_the_run_itself_diverges_nowhere(cli, replayed):
    cfg, plain = replayed
    export = export_of(plain.ticks, Path("self.json"))
    res = cli("run", "-c", cfg, "-o", "scored", "--observed", export)
    assert res.code == 0, res.err
    scored = read_run(Path("scored"))
    section = scored.summary.pop("observed")
    assert scored.summary == plain.summary  # --observed adds the section and changes nothing else
    assert scored.ticks.equals(plain.ticks)
    assert set(section["signals"]) == set(GAUGES)
    for signal, pools in section["signals"].items():
        d = pools["default"]
        assert d["windows"] == -(-plain.ticks.height // 20), signal  # the run's ticks in 20 s windows
        assert d["mae"] == pytest.approx(0, abs=1e-12) and d["gap"] == pytest.approx(0, abs=1e-12), signal
        assert d["mape"] in (None, pytest.approx(0, abs=1e-12)), signal
    # the ones that move over the run correlate perfectly (a constant has no r)
    assert section["signals"]["running"]["default"]["correlation"] == pytest.approx(1)
    assert section["signals"]["kv_usage"]["default"]["correlation"] == pytest.approx(1)
    assert "ttft_s_p50/default" in section["not_observed"]
    assert "observed vs replayed" in res.out and "running" in res.out
    assert "replayed, not in the export: e2e_s_p50" in res.err


def test_a_gap_put_into_the_export_is_reported_where_it_was_put(cli, replayed):
    cfg, plain = replayed
    # +40 waiting over ticks 61..80 s: the whole of the fourth 20 s window, whose last tick is 80 s
    export = export_of(plain.ticks, Path("gap.json"), extra=40, between=(61, 80))
    res = cli("run", "-c", cfg, "-o", "scored", "--observed", export, "--json")
    assert res.code == 0, res.err
    waiting = json.loads(res.out)["observed"]["signals"]["waiting"]["default"]
    assert waiting["gap"] == pytest.approx(40) and waiting["gap_at_s"] == 80
    assert waiting["observed_at_gap"] - waiting["replayed_at_gap"] == pytest.approx(40)
    assert waiting["mae"] == pytest.approx(40 / waiting["windows"])
    running = json.loads(res.out)["observed"]["signals"]["running"]["default"]
    assert running["gap"] == pytest.approx(0, abs=1e-12)

    # validate scores the written run the same way, without replaying or writing
    before = sorted(p.name for p in Path(".").iterdir())
    again = cli("validate", "plain", "--observed", export, "--json")
    assert again.code == 0, again.err
    assert json.loads(again.out)["signals"] == json.loads(res.out)["observed"]["signals"]
    assert sorted(p.name for p in Path(".").iterdir()) == before
    table = cli("validate", "plain", "--observed", export)
    row = next(line for line in table.out.splitlines() if "waiting" in line)
    assert "40" in row and "1:20 (22:14:40Z)" in row  # trace time, and wall time in the export


def test_a_run_without_observed_has_no_section(replayed):
    _, plain = replayed
    assert "observed" not in plain.summary
    assert "observed:" in plain.config_text  # the section the run was read with is kept for validate


def _matrix(*series) -> str:
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": labels, "values": values} for labels, values in series]}})


_GOOD = ({"__name__": "vllm:num_requests_running", "pool": "default"}, [[OFFSET + 1, "1"], [OFFSET + 2, "2"]])
BAD_EXPORTS = {
    "not-a-format": ("hello there\n", "not one of the observed-metrics formats"),
    "nothing-known": (_matrix(({"__name__": "node_load1"}, [[OFFSET + 1, "1"]])), "found node_load1"),
    "no-pool": (_matrix(({"__name__": "vllm:num_requests_running", "pool": "chat"}, [[OFFSET + 1, "1"]])),
                "maps to no pool"),
    "outside-window": (_matrix(({"__name__": "vllm:num_requests_running", "pool": "default"},
                                [[OFFSET - 86_400 * 365, "1"]])), "none within the trace's window"),
    "non-numeric": (_matrix(({"__name__": "vllm:num_requests_running", "pool": "default"}, [[OFFSET + 1, "lots"]])),
                    "lots"),
    "not-cumulative": (_matrix(
        ({"__name__": "vllm:e2e_request_latency_seconds_bucket", "pool": "default", "le": "1"}, [[OFFSET + 1, "5"]]),
        ({"__name__": "vllm:e2e_request_latency_seconds_bucket", "pool": "default", "le": "+Inf"},
         [[OFFSET + 1, "3"]])), "expected cumulative buckets"),
}


def _one_line_refusal(res, *expected: str) -> None:
    assert res.code == 2, (res.code, res.err)
    lines = res.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llm-replay: error: "), res.err
    for text in expected:
        assert text in lines[0], lines[0]
    assert "Traceback" not in res.err


@pytest.mark.parametrize("case", sorted(BAD_EXPORTS))
def test_a_bad_export_is_one_line_and_writes_nothing(cli, write, case):
    text, expected = BAD_EXPORTS[case]
    cfg = write("fleet.yaml", small_fleet(TRACE, extra=OBSERVED))
    export = write(f"{case}.json", text)
    _one_line_refusal(cli("run", "-c", cfg, "-o", "out", "--observed", export), f"{case}.json", expected)
    assert not Path("out").exists()


@pytest.mark.parametrize("observed, expected", [
    ("", "observed.offset_s: not set"),
    ("observed: {offset_s: 1, windows_s: 5}\n", "unknown key 'observed.windows_s'"),
    (f"observed: {{offset_s: {OFFSET}, pools: {{vllm-a: chat}}}}\n", "observed.pools.vllm-a: 'chat' is not a pool"),
])
def test_a_bad_observed_section_is_one_line_and_writes_nothing(cli, write, observed, expected):
    cfg = write("fleet.yaml", small_fleet(TRACE, extra=observed))
    export = write("ok.json", _matrix(_GOOD))
    _one_line_refusal(cli("run", "-c", cfg, "-o", "out", "--observed", export), "fleet.yaml", expected)
    assert not Path("out").exists()


def test_a_missing_export_is_refused_with_or_without_tui(cli, write):
    cfg = write("fleet.yaml", small_fleet(TRACE, extra=OBSERVED))
    _one_line_refusal(cli("run", "-c", cfg, "-o", "out", "--observed", "gone.json"), "gone.json")
    # run --tui --observed works (tests/tui/test_observed.py); a bad export fails before the dashboard
    _one_line_refusal(cli("run", "-c", cfg, "-o", "out", "--tui", "--observed", "gone.json"), "gone.json")
    assert not Path("out").exists()


def test_validate_refuses_what_is_not_a_run(cli, write):
    export = write("ok.json", _matrix(_GOOD))
    _one_line_refusal(cli("validate", "nowhere", "--observed", export), "nowhere: no such directory")
    write("half/summary.json", "{}")
    _one_line_refusal(cli("validate", "half", "--observed", export), "lacks config.yaml")


TTFT_LE = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
           80.0, 160.0, 640.0, 2560.0, float("inf"))  # vLLM's vllm:time_to_first_token_seconds buckets


def test_counters_and_latency_histograms_of_the_run_itself_diverge_nowhere(cli, replayed):
    """The replayed rates and quantiles are what Prometheus would compute from the run scraped
    once per tick: counters of its tokens and finishes, TTFT observed at the first token."""
    cfg, plain = replayed
    ticks = plain.ticks.sort("t_us")
    t_us = ticks["t_us"].to_list()
    stamp = [OFFSET + t / 1e6 for t in t_us]
    result = []
    for name, column in (("vllm:prompt_tokens_total", "prompt_tokens_per_s"),
                         ("vllm:request_success_total", "finished")):
        total, values = 0.0, []
        for v in ticks[column].to_list():
            total += v  # a count per tick, or per second with tick_s 1 s
            values.append(total)
        result.append({"metric": {"__name__": name, "pool": "default"},
                       "values": [[s, repr(v)] for s, v in zip(stamp, values)]})
    firsts = plain.requests.filter(pl.col("first_token_us").is_not_null())
    at = firsts["first_token_us"].to_list()
    ttft = [(f - a) / 1e6 for f, a in zip(at, firsts["arrival_us"].to_list())]
    for le in TTFT_LE:
        counts = [sum(1 for w, x in zip(at, ttft) if w <= t and x <= le) for t in t_us]
        result.append({"metric": {"__name__": "vllm:time_to_first_token_seconds_bucket", "pool": "default",
                                  "le": "+Inf" if le == float("inf") else repr(le)},
                       "values": [[s, repr(float(c))] for s, c in zip(stamp, counts)]})
    Path("hist.json").write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}))
    res = cli("validate", "plain", "--observed", "hist.json", "--json")
    assert res.code == 0, res.err
    signals = json.loads(res.out)["signals"]
    assert {"prompt_tokens_per_s", "finished_per_s", "ttft_s_p50", "ttft_s_p90", "ttft_s_p99"} <= set(signals)
    for signal in ("prompt_tokens_per_s", "finished_per_s", "ttft_s_p50", "ttft_s_p90", "ttft_s_p99"):
        d = signals[signal]["default"]
        assert d["windows"] > 0 and d["mae"] == pytest.approx(0, abs=1e-9), (signal, d)


def test_the_shipped_example_shows_its_stall(cli):
    """README's post-mortem: tests/fixtures/observed/incident.json is a replay of fleet.yaml with
    a stall put in from 5:00 to 7:00 (make_incident.py); the divergence points there."""
    here = Path(__file__).resolve().parents[1] / "fixtures" / "observed"
    res = cli("run", "-c", here / "fleet.yaml", "-o", "chat", "--observed", here / "incident.json", "--json")
    assert res.code == 0, res.err
    section = json.loads(res.out)["observed"]
    waiting = section["signals"]["waiting"]["chat"]
    assert waiting["gap"] == pytest.approx(12, abs=0.5) and 300 < waiting["gap_at_s"] <= 420
    for signal in ("ttft_s_p50", "output_tokens_per_s"):
        assert 300 < section["signals"][signal]["chat"]["gap_at_s"] <= 420, signal
    assert section["signals"]["replicas"]["chat"]["mae"] == 0
    assert section["unknown_metrics"] == ["process_cpu_seconds_total"]
    assert "left out: process_cpu_seconds_total" in res.err
