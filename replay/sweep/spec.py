"""SWEEP.yaml: a base config, a trace, and a grid or a seeded random sample over dotted config keys.

    base: fleet.yaml            # a config file (relative to SWEEP.yaml), or the config inline
    trace: azure-conv-2023      # optional: replaces the base's trace: section (a path or a section)
    traces: [a.csv, b.csv]      # optional: the trace itself swept (the key trace.path)
    grid:
      pools.0.replicas: [1, 2, 4]
      router: [least-outstanding, round-robin]
      trace.rate_scale: [1.0, 2.0]
    sample: {n: 8, seed: 0}     # optional: n cells drawn from the grid instead of all of them;
                                # a value may then be a range {low: 1, high: 8} (ints: whole numbers)

Every key is checked against the config schema (replay/sweep/keys.py) here, before any cell is
built; each cell's config is then built as `run --config` builds one (replay/sweep/cells.py).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import random
from pathlib import Path
from typing import Any

from common.configtools import suggest
from common.errors import ConfigError
from common.yamlfile import read_yaml
from replay.config import FleetConfig
from replay.sweep.keys import check_key

TOP_KEYS = ("base", "trace", "traces", "grid", "sample")
SAMPLE_KEYS = ("n", "seed")


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    source: str  # the sweep file, for messages
    base: dict  # the base config mapping, trace paths absolute
    base_dir: Path  # where the base config's own relative paths (profiles, tables) start
    keys: tuple[str, ...]  # as the user wrote them (the results table's first columns)
    paths: tuple[str, ...]  # the same keys in canonical form (replay/sweep/keys.py)
    cells: tuple[tuple[Any, ...], ...]  # one value per key per cell, in grid (or draw) order


def read_spec(path: str | Path) -> SweepSpec:
    path = Path(path)
    source = str(path)
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with base, grid (and trace, traces, sample); "
                          f"got {type(data).__name__}")
    unknown = [str(k) for k in data if k not in TOP_KEYS]
    if unknown:
        raise ConfigError(f"{source}: unknown key {unknown[0]!r}{suggest(unknown[0], TOP_KEYS)}; known keys: "
                          f"{', '.join(TOP_KEYS)}")
    here = path.resolve().parent
    base, base_dir = _base(data.get("base"), here, source)
    if data.get("trace") is not None:
        trace = data["trace"]
        if isinstance(trace, str):
            trace = {"path": trace}
        if not isinstance(trace, dict):
            raise ConfigError(f"{source}: trace: got {trace!r}, expected a trace path or a trace: section")
        base["trace"] = absolute_trace(trace, here)
    grid = data.get("grid")
    if grid is None:
        grid = {}
    if not isinstance(grid, dict):
        raise ConfigError(f"{source}: grid: expected a mapping of dotted config keys to lists of values")
    grid = dict(grid)
    if data.get("traces") is not None:
        traces = data["traces"]
        if not isinstance(traces, list) or not traces or not all(isinstance(t, str) for t in traces):
            raise ConfigError(f"{source}: traces: expected a list of trace paths or bundled names")
        if "trace.path" in grid:
            raise ConfigError(f"{source}: traces: and grid: trace.path both sweep the trace; keep one")
        grid = {"trace.path": [absolute_trace({"path": t}, here)["path"] for t in traces], **grid}
    if not grid:
        raise ConfigError(f"{source}: grid: no keys to sweep (expected e.g. grid: {{pools.0.replicas: [1, 2, 4]}})")
    keys = tuple(str(k) for k in grid)
    paths = tuple(check_key(k, base, source) for k in keys)
    for key, full in zip(keys, paths):  # swept traces are relative to the sweep file, as its trace: is
        if full in ("trace", "trace.path") and isinstance(grid[key], list):
            grid[key] = [_swept_trace(v, full, here) for v in grid[key]]
    cells = _cells(grid, keys, data.get("sample"), source)
    return SweepSpec(source, base, base_dir, keys, paths, cells)


def _swept_trace(value: Any, full: str, here: Path) -> Any:
    if full == "trace.path" and isinstance(value, str):
        return absolute_trace({"path": value}, here)["path"]
    if full == "trace" and isinstance(value, dict):
        return absolute_trace(value, here)
    return value


def _base(value: Any, here: Path, source: str) -> tuple[dict, Path]:
    """The base config mapping (a copy) and the folder its relative paths start from."""
    if value is None:
        raise ConfigError(f"{source}: base: missing; expected a fleet config file or the config inline")
    if isinstance(value, str):
        path = Path(value).expanduser()
        path = path if path.is_absolute() else here / path
        base = read_yaml(path)
        if not isinstance(base, dict):
            raise ConfigError(f"{source}: base: {value}: expected a fleet config mapping")
        base_dir = path.resolve().parent
    elif isinstance(value, dict):
        base, base_dir = value, here
    else:
        raise ConfigError(f"{source}: base: got {value!r}, expected a config file path or a mapping")
    base = copy.deepcopy(base)
    if base.get("trace") is not None:
        if not isinstance(base["trace"], dict):
            raise ConfigError(f"{source}: base: trace: expected a trace: section mapping")
        base["trace"] = absolute_trace(base["trace"], base_dir)
    if "pools" not in base:  # the default fleet's pools, so that pools.0... keys have a pool to set
        base["pools"] = [{"name": p.name, "replicas": p.replicas, "tensor_parallel_size": p.tensor_parallel_size}
                         for p in FleetConfig().pools]
    return base, base_dir


def absolute_trace(section: dict, base_dir: Path) -> dict:
    """A trace: section with its file paths absolute (bundled names stay names), as a run's
    config.yaml records them (replay/cli/trace_options.py effective_trace)."""
    from traces import BUNDLED

    def fix(path: Any) -> Any:
        if not isinstance(path, str) or path in BUNDLED or Path(path).expanduser().is_absolute():
            return path
        return str((base_dir / Path(path).expanduser()).resolve())

    out = dict(section)
    if "path" in out:
        out["path"] = fix(out["path"])
    if isinstance(out.get("merge"), list):
        out["merge"] = [{**m, "path": fix(m.get("path"))} if isinstance(m, dict) else m for m in out["merge"]]
    return out


def _cells(grid: dict, keys: tuple[str, ...], sample: Any, source: str) -> tuple[tuple[Any, ...], ...]:
    ranges = {k: v for k, v in grid.items() if isinstance(v, dict)}
    for key, values in grid.items():
        if key in ranges:
            _check_range(key, values, source, sampled=sample is not None)
        elif not isinstance(values, list) or not values:
            raise ConfigError(f"{source}: grid.{key}: got {values!r}, expected a non-empty list of values")
    if sample is None:
        return tuple(itertools.product(*(grid[k] for k in keys)))
    if not isinstance(sample, dict) or [k for k in sample if k not in SAMPLE_KEYS]:
        raise ConfigError(f"{source}: sample: expected {{n: CELLS, seed: SEED}}; got {sample!r}")
    n, seed = sample.get("n"), sample.get("seed", 0)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"{source}: sample.n: got {n!r}, expected a whole number of cells >= 1")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"{source}: sample.seed: got {seed!r}, expected an integer")
    rng = random.Random(seed)
    if not ranges:  # n distinct cells of the grid, drawn without replacement
        size = 1
        for k in keys:
            size *= len(grid[k])
        if n > size:
            raise ConfigError(f"{source}: sample.n: got {n}, expected at most the grid's {size} cells")
        picks = rng.sample(range(size), n)
        every = list(itertools.product(*(grid[k] for k in keys))) if size <= 1_000_000 else None
        if every is not None:
            return tuple(every[i] for i in picks)
    return tuple(tuple(_draw(rng, grid[k]) for k in keys) for _ in range(n))


def _check_range(key: str, spec: dict, source: str, sampled: bool) -> None:
    if not sampled:
        raise ConfigError(f"{source}: grid.{key}: a range {{low, high}} needs sample: {{n: CELLS}} (a grid takes lists)")
    low, high = spec.get("low"), spec.get("high")
    if set(spec) - {"low", "high"} or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in (low, high)):
        raise ConfigError(f"{source}: grid.{key}: got {spec!r}, expected a range {{low: NUMBER, high: NUMBER}}")
    if not low <= high:
        raise ConfigError(f"{source}: grid.{key}: low {low} is above high {high}")


def _draw(rng: random.Random, values: Any) -> Any:
    if isinstance(values, list):
        return values[rng.randrange(len(values))]
    low, high = values["low"], values["high"]
    if isinstance(low, int) and isinstance(high, int):
        return rng.randint(low, high)
    return rng.uniform(low, high)
