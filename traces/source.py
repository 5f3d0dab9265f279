"""Open a trace file: resolve bundled names, refuse anything but a regular file, hash and gunzip
the bytes within bounds, refuse binary input from its first bytes, split text into numbered
lines, and detect the format from the header or first line."""

from __future__ import annotations

import codecs
import csv
import dataclasses
import gzip
import hashlib
import io
import json
import pathlib
import zlib

import polars as pl

from common.errors import TraceError
from common.files import file_size, open_regular
from traces.bundled import BUNDLED, bundled_trace_path
from traces.limits import DEFAULT_LIMITS, TraceLimits, human_bytes

GENERIC_FORMATS = ("csv", "jsonl", "parquet")
FORMATS = ("aiperf", "azure", "blis", "burstgpt", "csv", "genai-perf", "inference-perf", "jsonl", "litellm",
           "mooncake", "parquet", "splitwise", "vidur")

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
VIDUR_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")

_SNIFF_BYTES = 8192
_CHUNK_BYTES = 16 << 20


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
        if self.text is None:
            return ""
        end = self.text.find("\n")  # not split(): that would copy the rest of the file
        return (self.text if end < 0 else self.text[:end]).rstrip("\r")

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


def open_source(path: str | pathlib.Path, limits: TraceLimits = DEFAULT_LIMITS) -> Source:
    """Read `path` (or the bundled trace of that name) into a `Source`; every failure is a TraceError.

    Only a regular file is opened; its first bytes say whether it is gzip, Parquet or text, and a
    binary file is refused from them alone. Reading stops as soon as the (decompressed) bytes
    pass `limits.max_bytes`, and a text file of more than `limits.max_rows` lines is refused."""
    display = str(path)
    if display in BUNDLED:
        file = bundled_trace_path(display)
    else:
        file = pathlib.Path(display).expanduser()
    if not file.exists() and not file.is_symlink():
        hint = f" (not a file, and not a bundled trace: {', '.join(sorted(BUNDLED))})"
        raise TraceError(f"{display}: file not found{hint}")
    with open_regular(file, display, "trace", TraceError) as handle:
        hashing = _Hashing(handle)
        try:
            data = _read_bounded(hashing, display, limits, file_size(handle))
            while hashing.read(1 << 20):  # the hash covers every byte of the file
                pass
        except OSError as exc:
            raise TraceError(f"{display}: cannot read the file ({exc.strerror or exc})") from None
    if not data or data.isspace():  # (no stripped copy of a large file)
        raise TraceError(f"{display}: file is empty (expected a trace with at least one request)")
    if data[:4] == b"PAR1":
        _check_parquet_rows(data, display, limits.max_rows)
        return Source(display, file, hashing.sha.hexdigest(), data, None)
    text = _decode(data, display)
    if "\n" not in text and "\r" in text:
        # Classic Mac line endings (CR only): every reader below splits on LF.
        text, data = text.replace("\r", "\n"), data.replace(b"\r", b"\n")
    if text.count("\n") + (not text.endswith("\n")) > limits.max_rows:  # CR-only lines are counted here
        raise _too_many_lines(display, limits.max_rows)
    return Source(display, file, hashing.sha.hexdigest(), data, text)


class _Hashing:
    """A reader that hashes what passes through it (the gzip reader pulls the raw bytes through)."""

    def __init__(self, handle):
        self.handle = handle
        self.sha = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        chunk = self.handle.read(size)
        self.sha.update(chunk)
        return chunk


def _read_bounded(raw: _Hashing, display: str, limits: TraceLimits, size: int) -> bytes:
    """The file's bytes, gunzipped when it starts with gzip's magic number; sniffed for binary
    content after the first block; a TraceError as soon as more than `limits.max_bytes` bytes or
    (text) `limits.max_rows` lines would be produced, so a gzip bomb stops early."""
    max_bytes = limits.max_bytes
    gz = raw.handle.peek(2)[:2] == b"\x1f\x8b"
    if not gz and size > max_bytes:
        raise TraceError(f"{display}: {human_bytes(size)}, more than the bound of {human_bytes(max_bytes)} "
                         "(--max-trace-bytes raises it)")
    reader = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
    chunks: list[bytes] = []
    total = lines = 0
    text = True
    line_start = 0  # offset of the line not yet ended: every line before it is within the bound
    try:
        while chunk := reader.read(min(_CHUNK_BYTES, max_bytes + 1 - total)):
            if not chunks:
                _sniff(chunk, display)
                text = chunk[:4] != b"PAR1"  # Parquet's rows are counted from its footer
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                what = "decompresses to" if gz else "holds"
                raise TraceError(f"{display}: {what} more than the bound of {human_bytes(max_bytes)} "
                                 "(--max-trace-bytes raises it)")
            if text:
                line_start = _check_lines(chunk, total - len(chunk), line_start, limits, display, lines)
                lines += chunk.count(b"\n")
            if lines > limits.max_rows:
                raise _too_many_lines(display, limits.max_rows)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise TraceError(
            f"{display}: truncated or corrupt gzip data ({exc}); expected a complete .gz file"
        ) from None
    return b"".join(chunks)


def _check_lines(chunk: bytes, offset: int, line_start: int, limits: TraceLimits, display: str,
                 lines_before: int) -> int:
    """The offset of the line still open at the end of `chunk` (which starts at `offset`, after
    `lines_before` line endings), once no line ending in it is longer than the bound: a TraceError
    names the first that is. Each step jumps to the last line ending within the bound of the open
    line's start, so a chunk costs about 2 x len(chunk) / bound searches however many lines it
    holds. CR counts as a line ending too (CR-only files are split on it later)."""
    limit = limits.max_line_bytes
    end = offset + len(chunk)
    while True:
        lo = max(line_start - offset, 0)  # bytes before `offset` hold no line ending
        hi = min(line_start + limit + 1 - offset, len(chunk))  # a line of `limit` bytes, then its ending
        nl = max(chunk.rfind(b"\n", lo, hi), chunk.rfind(b"\r", lo, hi))
        if nl >= 0:
            line_start = offset + nl + 1
        elif line_start + limit + 1 <= end:
            line = lines_before + (chunk.count(b"\n", 0, lo) or (0 if lines_before else chunk.count(b"\r", 0, lo)))
            raise _long_line(display, line + 1, limit)
        else:
            return line_start


def _long_line(display: str, line: int, limit: int) -> TraceError:
    return TraceError(f"{display} line {line:,}: longer than the bound of {human_bytes(limit)} per line "
                      "(--max-line-bytes raises it)")


def _too_many_lines(display: str, max_rows: int) -> TraceError:
    return TraceError(f"{display}: more than {max_rows:,} lines, the bound on rows (--max-rows raises it)")


def _sniff(head: bytes, display: str) -> None:
    """Refuse binary data from its first bytes (Parquet excepted), without reading the rest."""
    if head[:4] == b"PAR1":
        return
    head = head[:_SNIFF_BYTES]
    nul = head.find(b"\x00")
    if nul >= 0:
        raise TraceError(
            f"{display}: not a text file (byte 0x00 at offset {nul}); expected CSV, JSONL or Parquet"
        )
    try:  # an incremental decoder accepts a character cut at the end of the block
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError as exc:
        raise TraceError(
            f"{display}: not a text file (byte 0x{head[exc.start]:02x} at offset {exc.start} is not UTF-8); "
            "expected CSV, JSONL or Parquet"
        ) from None


def _check_parquet_rows(data: bytes, display: str, max_rows: int) -> None:
    try:  # the row count is in the footer: nothing is decoded
        rows = pl.scan_parquet(io.BytesIO(data)).select(pl.len()).collect().item()
    except pl.exceptions.PolarsError:
        return  # unreadable: read_parquet says why, naming the file
    if rows > max_rows:
        raise TraceError(f"{display}: {rows:,} rows, more than the bound of {max_rows:,} (--max-rows raises it)")


def _decode(data: bytes, display: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        bad = data[exc.start]
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
    if not column_map and (log := _detect_log(src, first)):
        return log
    if first.startswith("{"):
        if column_map:
            return "jsonl"
        try:
            keys = json.loads(first, parse_int=str)  # only the keys matter here
        except (ValueError, RecursionError):  # not JSON, a number of 4300+ digits, or nested too deep
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


def _detect_log(src: Source, first: str) -> str | None:
    """A request log of a serving or benchmarking tool (traces/records.py), from the keys of its
    first JSON object or its CSV header."""
    from traces.records import BLIS_COLUMNS, LITELLM_COLUMNS, first_json_object  # (records imports this module)

    if first.startswith(("{", "[")):
        keys = set(first_json_object(src) or ())
        if keys >= set(LITELLM_COLUMNS):
            return "litellm"
        if keys >= {"metadata", "metrics"}:
            return "aiperf"
        if keys >= {"start_time", "end_time", "info"}:
            return "inference-perf"
        if "experiments" in keys:
            return "genai-perf"
        return None
    names = set(header_names(src))
    if names >= set(LITELLM_COLUMNS):
        return "litellm"
    if names >= set(BLIS_COLUMNS):
        return "blis"
    return None


def _undetectable(src: Source, first: str) -> TraceError:
    shown = first if len(first) <= 100 else first[:97] + "..."
    return TraceError(
        f"{src.display}: cannot detect the trace format: line 1 is {shown!r}; known formats: "
        f"{', '.join(FORMATS)} (csv, jsonl and parquet need a column_map); pass the format explicitly"
    )


def detect_format(path: str | pathlib.Path) -> str:
    """The format name `load_trace` would use for `path` with no explicit format or column map."""
    return detect(open_source(path))
