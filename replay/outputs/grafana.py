"""The Grafana dashboard shipped with the package (replay/outputs/grafana/llm-replay.json): the
TUI's charts as PromQL over vLLM's metric names, with a templated Prometheus datasource and `run`
and `pool` variables. Both variables default to All (`.*`), which also matches series without
the label, so the same dashboard reads a real deployment's Prometheus unchanged.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime, timezone
from functools import cache
from importlib import resources

DASHBOARD = "llm-replay.json"


@cache
def shipped_dashboard() -> dict:
    return json.loads(resources.files("replay.outputs").joinpath("grafana", DASHBOARD).read_text("utf-8"))


def _iso(us: int) -> str:
    return datetime.fromtimestamp(us / 1e6, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def dashboard_for(run_label: str, start_us: int, end_us: int) -> dict:
    """The shipped dashboard opened on one exported run: `run` preset to its label and the time
    range to its span (the wall-clock times `export --format openmetrics` gave its samples)."""
    dash = copy.deepcopy(shipped_dashboard())
    for var in dash["templating"]["list"]:
        if var["name"] == "run":
            var["current"] = {"selected": True, "text": [run_label], "value": [run_label]}
    dash["time"] = {"from": _iso(start_us), "to": _iso(end_us)}
    return dash
