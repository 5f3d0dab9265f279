"""Open a trace file: resolve bundled names, hash and gunzip the bytes, refuse binary input,
split text into numbered lines, and detect the format from the header or first line."""

from __future__ import annotations

import csv
import dataclasses
import gzip
import hashlib
import json
import pathlib
import zlib

import polars as pl

from traces.bundled import BUNDLED, bundled_trace_path
from traces.errors import TraceError

GENERIC_FORMATS = ("csv", "jsonl", "parquet")
FORMATS = ("azure", "burstgpt", "csv", "jsonl", "mooncake", "parquet", "splitwise", "vidur")

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
VIDUR_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")

_SNIFF_BYTES = 8192


@dataclasses.dataclass(frozen=True)
class Source:
    """One trace file's bytes; `display` is how error messages name it (path as given, or bundled name)."""

    display: str
    path: pathlib.Path
    sha256: str
    data: bytes  # decompressed
    text: str | None  # None for Parquet

    @property
    def is_parquet(self) -> bool:
        return self.text is None

    @property
    def stem(self) -> str:
        name = self.path.name
        for suffix in (".gz", ".csv", ".jsonl", ".json", ".ndjson", ".parquet", ".txt"):
            name = name.removesuffix(suffix)
        return name

    def first_line(self) -> str:
        return "" if self.text is None else self.text.split("\n", 1)[0].rstrip("\r")

    def lines(self) -> pl.DataFrame:
        """Non-blank lines as (`__line` 1-based Int64, `text` without the line ending)."""
        assert self.text is not None
        frame = (
            pl.DataFrame({"text": [self.text]})
            .select(pl.col("text").str.split("\n"))
            .explode("text")
            .with_row_index("__line", offset=1)
            .with_columns(pl.col("__line").cast(pl.Int64), pl.col("text").str.strip_suffix("\r"))
        )
        return frame.filter(pl.col("text").str.strip_chars() != "")


def open_source(path: str | pathlib.Path) -> Source:
    """Read `path` (or the bundled trace of that name) into a `Source`; every failure is a TraceError."""
    display = str(path)
    if display in BUNDLED:
        file = bundled_trace_path(display)
    else:
        file = pathlib.Path(display).expanduser()
    if not file.exists():
        hint = f" (not a file, and not a bundled trace: {', '.join(sorted(BUNDLED))})"
        raise TraceError(f"{display}: file not found{hint}")
    if file.is_dir():
        raise TraceError(f"{display}: is a directory (expected a trace file)")
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise TraceError(f"{display}: cannot read the file ({exc.strerror or exc})") from None
    data = _gunzip(raw, display) if raw[:2] == b"\x1f\x8b" else raw
    if not data.strip():
        raise TraceError(f"{display}: file is empty (expected a trace with at least one request)")
    sha = hashlib.sha256(raw).hexdigest()
    if data[:4] == b"PAR1":
        return Source(display, file, sha, data, None)
    return Source(display, file, sha, data, _decode(data, display))


def _gunzip(raw: bytes, display: str) -> bytes:
    try:
        return gzip.decompress(raw)
    except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as exc:
        raise TraceError(
            f"{display}: truncated or corrupt gzip data ({exc}); expected a complete .gz file"
        ) from None


def _decode(data: bytes, display: str) -> str:
    nul = data.find(b"\x00", 0, _SNIFF_BYTES)
    if nul >= 0:
        raise TraceError(
            f"{display}: not a text file (byte 0x00 at offset {nul}); expected CSV, JSONL or Parquet"
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        bad = data[exc.start]
        if exc.start < _SNIFF_BYTES:
            raise TraceError(
                f"{display}: not a text file (byte 0x{bad:02x} at offset {exc.start} is not UTF-8); "
                "expected CSV, JSONL or Parquet"
            ) from None
        line = data.count(b"\n", 0, exc.start) + 1
        raise TraceError(
            f"{display} line {line}: byte 0x{bad:02x} is not valid UTF-8 (expected UTF-8 text)"
        ) from None


def header_names(src: Source) -> list[str]:
    """The CSV header of `src`, names stripped of surrounding spaces."""
    return [name.strip() for name in next(csv.reader([src.first_line()]), [])]


def detect(src: Source, column_map: dict | None = None) -> str:
    """Format name of `src`; with a column map only the container (csv, jsonl, parquet) is detected."""
    if src.is_parquet:
        return "parquet"
    first = src.first_line().strip()
    if first.startswith("{"):
        if column_map:
            return "jsonl"
        try:
            keys = json.loads(first)
        except json.JSONDecodeError:
            keys = None
        if isinstance(keys, dict) and sorted(keys) == sorted(MOONCAKE_KEYS):
            return "mooncake"
        raise _undetectable(src, first)
    if column_map:
        return "csv"
    names = set(header_names(src))
    if names >= set(AZURE_COLUMNS):
        return "azure"
    if names >= set(BURSTGPT_COLUMNS):
        return "burstgpt"
    if names == set(VIDUR_COLUMNS):
        return "splitwise"
    if names > set(VIDUR_COLUMNS):
        return "vidur"
    raise _undetectable(src, first)


def _undetectable(src: Source, first: str) -> TraceError:
    shown = first if len(first) <= 100 else first[:97] + "..."
    return TraceError(
        f"{src.display}: cannot detect the trace format: line 1 is {shown!r}; known formats: "
        f"{', '.join(FORMATS)} (csv, jsonl and parquet need a column_map); pass the format explicitly"
    )


def detect_format(path: str | pathlib.Path) -> str:
    """The format name `load_trace` would use for `path` with no explicit format or column map."""
    return detect(open_source(path))
