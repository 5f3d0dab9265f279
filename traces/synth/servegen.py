"""ServeGen's per-client files (alibaba/ServeGen `data/`, see shared/traces/README.md section 3).

`chunk-<id>-trace.csv[.gz]`: no header, one line per 10-minute window:
`window_start_s, rate, cv, pattern, shape, scale` (pattern `Gamma`, `Weibull`, or empty when the
client sent nothing). `chunk-<id>-dataset.json[.gz]`: window start -> field -> a Python dict
literal `{value: probability}` (ServeGen writes `str(dict)`, so it is read with
ast.literal_eval, which evaluates literals only). A file of another shape is a ConfigError
naming the file, the line and the field.
"""

from __future__ import annotations

import ast
import functools
import gzip
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.errors import ConfigError

WINDOW_S = 600.0
MAX_FILE_BYTES = 64 << 20  # the largest upstream dataset.json is about 30 MB
MAX_WINDOWS = 100_000
PATTERNS = ("Gamma", "Weibull", "")
_CHUNK = re.compile(r"^chunk-(.+)-trace\.csv(\.gz)?$")


@dataclass(frozen=True)
class ClientWindows:
    """One client's windows: start (s), rate (req/s), pattern (0 none, 1 Gamma, 2 Weibull), shape."""

    client: str
    start_s: np.ndarray
    rate: np.ndarray
    pattern: np.ndarray
    shape: np.ndarray


def _read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            with gzip.open(path, "rb") as fh:
                raw = fh.read(MAX_FILE_BYTES + 1)
    except (OSError, EOFError) as exc:
        raise ConfigError(f"{path}: cannot read ({exc})") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: more than {MAX_FILE_BYTES >> 20} MiB (expected a ServeGen file)")
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text (expected a ServeGen file)") from None


def client_files(folder: str, clients: tuple[str, ...] | None, where: str) -> list[tuple[str, Path]]:
    """(client id, trace file) of `folder`, numerically ordered, or of the ids asked for."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise ConfigError(f"{where}.path: {folder}: no such folder (expected ServeGen chunk-<id>-trace.csv files)")
    found = {m.group(1): p for p in root.iterdir() if (m := _CHUNK.match(p.name))}
    if not found:
        raise ConfigError(f"{where}.path: {folder}: no chunk-<id>-trace.csv[.gz] file")
    if clients is not None:
        missing = [c for c in clients if c not in found]
        if missing:
            raise ConfigError(f"{where}.clients: client {missing[0]!r} has no trace file in {folder}")
        found = {c: found[c] for c in clients}
    return sorted(found.items(), key=lambda kv: (not kv[0].isdigit(), int(kv[0]) if kv[0].isdigit() else 0, kv[0]))


def read_windows(client: str, path: Path) -> ClientWindows:
    lines = _read_text(path).splitlines()
    if len(lines) > MAX_WINDOWS:
        raise ConfigError(f"{path}: {len(lines):,} lines, expected at most {MAX_WINDOWS:,} windows")
    start, rate, pattern, shape = (np.empty(len(lines)) for _ in range(4))
    for i, line in enumerate(lines):
        fields = line.split(",")
        if len(fields) != 6:
            raise ConfigError(f"{path} line {i + 1}: {len(fields)} fields, expected 6 "
                              "(window_start_s, rate, cv, pattern, shape, scale)")
        try:
            start[i], rate[i], shape[i] = float(fields[0]), float(fields[1]), float(fields[4])
        except ValueError:
            raise ConfigError(f"{path} line {i + 1}: window_start_s, rate and shape must be numbers, "
                              f"got {line[:80]!r}") from None
        if fields[3] not in PATTERNS:
            raise ConfigError(f"{path} line {i + 1}: pattern {fields[3]!r}, expected Gamma, Weibull or empty")
        pattern[i] = PATTERNS.index(fields[3]) + 1 if fields[3] else 0
        if not (np.isfinite(rate[i]) and rate[i] >= 0) or (fields[3] and not (np.isfinite(shape[i]) and shape[i] > 0)):
            raise ConfigError(f"{path} line {i + 1}: rate {fields[1]} / shape {fields[4]}, expected rate >= 0 "
                              "and shape > 0 where a pattern is given")
    if len(lines) == 0 or np.any(np.diff(start) != WINDOW_S) or start[0] < 0:
        raise ConfigError(f"{path}: window_start_s must start >= 0 and step by {WINDOW_S:g} s")
    return ClientWindows(client, start, rate, pattern.astype(np.int8), shape)


def read_dataset(path: str, field: str, where: str) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Window start -> (values, probabilities) of `field`; windows whose PMF is empty are left out."""
    fields = read_dataset_fields(path, where)
    if field not in fields:
        raise ConfigError(f"{path}: no field {field!r}; the file has {', '.join(fields)}")
    return fields[field]


@functools.lru_cache(maxsize=8)
def read_dataset_fields(path: str, where: str) -> dict[str, dict[int, tuple[np.ndarray, np.ndarray]]]:
    """Field -> window start -> (values, probabilities) of a ServeGen dataset.json (cached: every
    arrival of a client draws from it)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"{where}.path: {path}: no such file (expected a ServeGen chunk-<id>-dataset.json)")
    try:
        data = json.loads(_read_text(p))
    except ValueError as exc:
        raise ConfigError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{path}: expected an object keyed by window start")
    out: dict[str, dict[int, tuple[np.ndarray, np.ndarray]]] = {}
    for key, fields in data.items():
        if not key.isdigit() or not isinstance(fields, dict):
            raise ConfigError(f"{path}: key {key!r}: expected a window start (seconds) mapping fields to PMFs")
        for field, text in fields.items():
            try:
                pmf = ast.literal_eval(text) if isinstance(text, str) else text
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                pmf = None
            if not isinstance(pmf, dict) or not all(isinstance(v, (int, float)) for v in pmf.values()) \
                    or not all(isinstance(v, (int, float)) for v in pmf):
                raise ConfigError(f"{path}: window {key}: field {field!r} is not a {{value: probability}} dict")
            table = out.setdefault(field, {})
            if pmf:
                values = np.array([float(v) for v in pmf], dtype=np.float64)
                weights = np.array(list(pmf.values()), dtype=np.float64)
                if np.any(weights < 0) or weights.sum() <= 0:
                    raise ConfigError(f"{path}: window {key}: field {field!r} has negative or zero probabilities")
                table[int(key)] = (values, weights)
    return out


def dataset_beside(trace_file: Path) -> Path | None:
    """The client's dataset.json[.gz] next to its trace file, if there is one."""
    stem = trace_file.name.split("-trace.csv")[0]
    for suffix in ("-dataset.json.gz", "-dataset.json"):
        candidate = trace_file.with_name(stem + suffix)
        if candidate.is_file():
            return candidate
    return None
