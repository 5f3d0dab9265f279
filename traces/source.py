"""Open a trace file: resolve bundled names, refuse anything but a regular file, hash and gunzip
the bytes within bounds, refuse binary input from its first bytes, split text into numbered
lines, and detect the format from the header or first line."""

from __future__ import annotations

import codecs
import csv
import dataclasses
import functools
import gzip
import hashlib
import io
import json
import pathlib
import re
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
_GLOB = re.compile(r"[*?\[\]{}]")
_HEAD_BYTES = 1 << 20  # kept of a file that is not held: format detection reads its first line and object


@dataclasses.dataclass(frozen=True, eq=False)
class Source:
    """One trace file, checked within its bounds; `display` is how error messages name it (path as
    given, or bundled name). The bytes are held only when they are not the file's own (gzip, a BOM,
    CR line endings): otherwise `scannable` is true, readers scan `path` lazily (`scan_lines`,
    polars' `scan_*`), and `data` / `text` read the file again only for whoever asks for them
    (the slow passes that name a bad line, the small log formats)."""

    display: str
    path: pathlib.Path
    sha256: str
    is_parquet: bool
    held: bytes | None  # the decompressed bytes, when they cannot be read back from `path` as they are
    head: bytes = b""  # the first bytes (up to _HEAD_BYTES) of the decompressed text
    has_quote: bool | None = None  # whether the text holds a '"' (None: look)
    typed: bool = True  # readers may parse numeric columns as they read (tables.read_csv)
    plain: bool = False  # the held bytes read as lines as they are (no BOM, no CR): scanned, not split here

    @property
    def quoted(self) -> bool:
        """Whether the text holds a quote character (then CSV records may span lines)."""
        return '"' in self.text if self.has_quote is None else self.has_quote

    @property
    def scannable(self) -> bool:
        """`path` holds exactly the bytes (and, for text, the lines) this source stands for."""
        return self.held is None

    @functools.cached_property
    def data(self) -> bytes:
        """The decompressed bytes (CR line endings made LF); read again from `path` when not held."""
        if self.held is not None:
            return self.held
        if self.head_is_whole and not self.is_parquet:
            return self.head  # the whole file
        with open_regular(self.path, self.display, "trace", TraceError) as handle:
            data = handle.read()
        if hashlib.sha256(data).hexdigest() != self.sha256:
            raise TraceError(f"{self.display}: the file changed while it was read (expected it to stay as it is)")
        return data

    @functools.cached_property
    def text(self) -> str | None:  # None for Parquet
        return None if self.is_parquet else self.data.decode("utf-8-sig")

    @property
    def stem(self) -> str:
        name = self.path.name
        for suffix in (".gz", ".csv", ".jsonl", ".json", ".ndjson", ".parquet", ".txt"):
            name = name.removesuffix(suffix)
        return name

    @property
    def head_is_whole(self) -> bool:
        return len(self.head) < _HEAD_BYTES

    @functools.cached_property
    def head_text(self) -> str:
        """The text's beginning: the whole text when it is shorter than _HEAD_BYTES, else a prefix
        of it cut at a character boundary."""
        if self.is_parquet:
            return ""
        if self.head_is_whole:
            return self.text
        return codecs.getincrementaldecoder("utf-8-sig")().decode(self.head, final=False)

    def first_line(self) -> str:
        if self.is_parquet:
            return ""
        text = self.head_text
        end = text.find("\n")  # not split(): that would copy the rest of the file
        if end < 0 and not self.head_is_whole:
            text = self.text
            end = text.find("\n")
        return (text if end < 0 else text[:end]).rstrip("\r")

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

    def scan_lines(self) -> pl.LazyFrame:
        """`lines()` as a lazy frame: scanned from the file when it is scannable (or from the held
        bytes, a gzip's, when they are `plain`), so the text is never decoded and split whole."""
        if not self.scannable and not self.plain:
            return self.lines().lazy()
        return (
            pl.scan_lines(self.path if self.scannable else io.BytesIO(self.held), name="text",
                          row_index_name="__line", row_index_offset=1)
            .with_columns(pl.col("__line").cast(pl.Int64))
            .filter(pl.col("text").str.strip_chars() != "")
        )

    def parquet_source(self) -> io.BytesIO | pathlib.Path:
        """What polars' Parquet readers open: the file itself, or its held bytes (a gzip's)."""
        return self.path if self.scannable else io.BytesIO(self.data)


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
            data, scan = _read_bounded(hashing, display, limits, file_size(handle))
            while hashing.read(1 << 20):  # the hash covers every byte of the file
                pass
        except OSError as exc:
            raise TraceError(f"{display}: cannot read the file ({exc.strerror or exc})") from None
    sha = hashing.sha.hexdigest()
    if data is None and _GLOB.search(str(file)):  # polars' scans would expand the name (and miss)
        data = Source(display, file, sha, scan.parquet, None, scan.head).data
    if data is None and scan.parquet:
        _check_parquet_rows(file, display, limits.max_rows)
        return Source(display, file, sha, True, None)
    if data is None and scan.scannable():
        if not scan.nonspace:
            raise TraceError(f"{display}: file is empty (expected a trace with at least one request)")
        if scan.bad_utf8 is not None:
            raise scan.bad_utf8
        if scan.lines + (scan.last != b"\n") > limits.max_rows:
            raise _too_many_lines(display, limits.max_rows)
        return Source(display, file, sha, False, None, scan.head, scan.quote)
    if data is None:  # text the readers cannot scan as it is: read it again and hold it
        data = Source(display, file, sha, False, None, scan.head).data
    return _held(display, file, sha, data, limits)


def _held(display: str, file: pathlib.Path, sha: str, data: bytes, limits: TraceLimits) -> Source:
    """A source whose decompressed bytes are held (a gzip, a BOM, CR line endings)."""
    if not data or data.isspace():  # (no stripped copy of a large file)
        raise TraceError(f"{display}: file is empty (expected a trace with at least one request)")
    if data[:4] == b"PAR1":
        _check_parquet_rows(io.BytesIO(data), display, limits.max_rows)
        return Source(display, file, sha, True, data)
    scan = _Scan(display)  # (UTF-8 checked a chunk at a time: no decoded copy of the text is made)
    for start in range(0, len(data), _CHUNK_BYTES):
        scan.add(data[start:start + _CHUNK_BYTES])
    if scan.scannable():  # lines as they are: the readers scan the bytes
        if scan.bad_utf8 is not None:
            raise scan.bad_utf8
        if scan.lines + (scan.last != b"\n") > limits.max_rows:
            raise _too_many_lines(display, limits.max_rows)
        return Source(display, file, sha, False, data, scan.head, scan.quote, plain=True)
    text = _decode(data, display)
    if "\n" not in text and "\r" in text:
        # Classic Mac line endings (CR only): every reader below splits on LF.
        text, data = text.replace("\r", "\n"), data.replace(b"\r", b"\n")
    if text.count("\n") + (not text.endswith("\n")) > limits.max_rows:  # CR-only lines are counted here
        raise _too_many_lines(display, limits.max_rows)
    source = Source(display, file, sha, False, data, data[:_HEAD_BYTES])
    source.__dict__["text"] = text  # (cached_property: decoded once)
    return source


class _Scan:
    """What one pass over a file's bytes found, so that a file the readers can scan as it is need
    not be held: UTF-8 checked incrementally (the first bad byte kept, raised after the bounds as
    before), whether any byte makes polars' scans read other lines than `Source.lines` (NUL, a CR
    not before LF, a BOM), and the first bytes."""

    def __init__(self, display: str):
        self.display = display
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.bad_utf8: TraceError | None = None
        self.parquet = False
        self.odd = False  # a byte the scans would read otherwise: the text is held instead
        self.nonspace = False
        self.quote = False
        self.head = b""
        self.last = b""
        self.lines = 0
        self.offset = 0

    def add(self, chunk: bytes) -> None:
        if not self.offset:
            self.parquet = chunk[:4] == b"PAR1"
            self.odd = chunk[:3] == codecs.BOM_UTF8
        if not self.parquet:
            if len(self.head) < _HEAD_BYTES:
                self.head += chunk[:_HEAD_BYTES - len(self.head)]
            self.nonspace = self.nonspace or not chunk.isspace()
            self.quote = self.quote or b'"' in chunk
            # a CR is read as part of a line unless it ends a CRLF (one cut between two chunks included)
            self.odd = (self.odd or b"\x00" in chunk or (self.last == b"\r" and chunk[:1] != b"\n")
                        or chunk.count(b"\r") != chunk.count(b"\r\n") + chunk.endswith(b"\r"))
            self._decode(chunk)
            self.lines += chunk.count(b"\n")
        self.offset += len(chunk)
        self.last = chunk[-1:]

    def _decode(self, chunk: bytes, final: bool = False) -> None:
        if self.bad_utf8 is not None:
            return
        try:
            self.decoder.decode(chunk, final=final)
        except UnicodeDecodeError as exc:
            # (exc.object starts with the bytes of a character the previous chunk cut: no line ending)
            line = self.lines + exc.object.count(b"\n", 0, exc.start) + 1
            self.bad_utf8 = TraceError(f"{self.display} line {line}: byte 0x{exc.object[exc.start]:02x} is not "
                                       "valid UTF-8 (expected UTF-8 text)")

    def scannable(self) -> bool:
        if not self.parquet:
            self._decode(b"", final=True)
        return not self.odd and self.last != b"\r"


class _Hashing:
    """A reader that hashes what passes through it (the gzip reader pulls the raw bytes through)."""

    def __init__(self, handle):
        self.handle = handle
        self.sha = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        chunk = self.handle.read(size)
        self.sha.update(chunk)
        return chunk


def _read_bounded(raw: _Hashing, display: str, limits: TraceLimits, size: int) -> tuple[bytes | None, _Scan]:
    """The file's bytes when it is a gzip (gunzipped), else None and what a pass over them found;
    sniffed for binary content after the first block; a TraceError as soon as more than
    `limits.max_bytes` bytes or (text) `limits.max_rows` lines would be produced, so a gzip bomb
    stops early."""
    max_bytes = limits.max_bytes
    gz = raw.handle.peek(2)[:2] == b"\x1f\x8b"
    if not gz and size > max_bytes:
        raise TraceError(f"{display}: {human_bytes(size)}, more than the bound of {human_bytes(max_bytes)} "
                         "(--max-trace-bytes raises it)")
    reader = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
    chunks: list[bytes] = []
    scan = _Scan(display)
    total = lines = 0
    text = True
    line_start = 0  # offset of the line not yet ended: every line before it is within the bound
    try:
        while chunk := reader.read(min(_CHUNK_BYTES, max_bytes + 1 - total)):
            if not total:
                _sniff(chunk, display)
                text = chunk[:4] != b"PAR1"  # Parquet's rows are counted from its footer
            if gz:
                chunks.append(chunk)
            else:
                scan.add(chunk)
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
    return (b"".join(chunks) if gz else None), scan


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


def _check_parquet_rows(source: io.BytesIO | pathlib.Path, display: str, max_rows: int) -> None:
    try:  # the row count is in the footer: nothing is decoded
        rows = pl.scan_parquet(source).select(pl.len()).collect().item()
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
