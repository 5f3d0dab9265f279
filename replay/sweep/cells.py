"""Each cell of a sweep built before any runs: its config (as `run --config` builds one) and its
trace, loaded once per distinct trace: section. A cell is named by its config hash and trace hash,
so the same cell in a later sweep (or a re-run of a killed one) is found already done."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from typing import Any

import yaml

from common.errors import UserError
from replay.config import FleetConfig, build_config
from replay.sweep.keys import set_key
from replay.sweep.spec import SweepSpec


@dataclasses.dataclass(frozen=True)
class Cell:
    index: int  # its row in the results table
    keys: dict[str, Any]  # key as the user wrote it -> this cell's value
    cfg: FleetConfig
    trace_key: str  # which loaded trace it replays (see load_traces)
    trace_sha256: str
    id: str  # of the config hash and the trace hash: the name of its files in --out

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={_show(v)}" for k, v in self.keys.items())


def _show(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text if len(text) <= 40 else text[:37] + "..."


def cell_id(config_sha256: str, trace_sha256: str) -> str:
    return hashlib.sha256(f"{config_sha256}:{trace_sha256}".encode()).hexdigest()[:16]


def build_cells(spec: SweepSpec) -> tuple[list[Cell], dict[str, Any]]:
    """Every cell, and the traces they replay (trace key -> traces.LoadedTrace). A key whose value
    a cell cannot take (wrong type, out of range, a bad trace) is a UserError naming the file, the
    key and the value: no cell runs until every one builds."""
    from replay.fleet.ticks import check_tick_count
    from traces import DEFAULT_TRACE, load_from_config

    configs = []
    for index, values in enumerate(spec.cells):
        data = copy.deepcopy(spec.base)
        for path, value in zip(spec.paths, values):
            set_key(data, path, copy.deepcopy(value), spec.source)
        if data.get("trace") is None:
            data["trace"] = {"path": DEFAULT_TRACE}  # what ran is what the cell's config hash records
        keys = dict(zip(spec.keys, values))
        where = f"{spec.source} (cell {index}: " + ", ".join(f"{k}={_show(v)}" for k, v in keys.items()) + ")"
        configs.append((index, keys, build_config(data, where, spec.base_dir), where))
    traces: dict[str, Any] = {}
    cells = []
    for index, keys, cfg, where in configs:
        trace_key = _trace_key(cfg)
        if trace_key not in traces:
            try:
                traces[trace_key] = load_from_config(cfg.trace)
            except UserError as exc:
                raise UserError(f"{where}: {exc}") from None
        trace = traces[trace_key]
        try:
            check_tick_count(trace.frame, cfg)
        except UserError as exc:
            raise UserError(f"{where}: {exc}") from None
        cells.append(Cell(index, keys, cfg, trace_key, trace.sha256, cell_id(cfg.sha256(), trace.sha256)))
    return cells, traces


def _trace_key(cfg: FleetConfig) -> str:
    section = dataclasses.asdict(cfg.trace)
    return hashlib.sha256(yaml.safe_dump(section, sort_keys=True).encode()).hexdigest()[:16]
