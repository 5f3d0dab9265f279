"""Read the columns an adapter needs from CSV, JSONL or Parquet, with each row's line number.

Every reader returns a frame of the requested columns plus `__line` (1-based line in the file,
header = line 1; for Parquet, the 1-based row). CSV and JSONL take a vectorised path and fall
back to a slow Python pass only to find and name a malformed line.

`numbered=False`: the vectorised paths keep no line numbers (a large file's rows cost no column
of them, and the scan of its lines computes none): a row's line is found again, from the file,
only when a message names it (`line_of`, which traces.fields.Checker takes). The slow passes,
which hold the text anyway, still number their rows.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Sequence

import polars as pl

from common.errors import TraceError
from traces.fields import show
from traces.source import Source, header_names

HASH_LIST = pl.List(pl.UInt64)
SLOW_CHUNK = 1 << 16  # records of a quoted CSV kept as Python strings at a time (_csv_slow)


def line_of(src: Source, header: bool) -> Callable[[int], int]:
    """The line of a text file's data row `index` (its index-th non-blank line, after the header
    line when `header`), read again from the file: for a message, never a frame's every row."""

    def locate(index: int) -> int:
        lines = src.scan_lines()
        if header:
            lines = lines.filter(pl.col("__line") > 1)
        return int(lines.select("__line").slice(index, 1).collect().item())

    return locate


def read_csv(src: Source, required: Sequence[str], optional: Sequence[str] = (),
             types: dict[str, pl.DataType] | None = None, numbered: bool = True) -> pl.DataFrame:
    """String columns `required` (must exist) and those of `optional` present in the header.

    A column of `types` (Int64 or Float64) comes parsed as `traces.fields` parses text (stripped,
    then cast) when every value of it parses, so the text of a large file is never held: the
    checkers' figures are the same either way. Where a checker then finds a bad value, the loader
    reads again without `types` (`Source.typed`), so the message quotes it as the file has it."""
    header = header_names(src)
    _check_header(src, header, required)
    wanted = [name for name in dict.fromkeys([*required, *optional]) if name in header]
    if src.quoted:
        frame = _csv_slow(src, header, wanted)
    else:
        frame = _csv_fast(src, header, wanted, (types or {}) if src.typed else {}, numbered)
    if frame.height == 0:
        raise TraceError(
            f"{src.display}: only a header, no requests (expected at least one data row after line 1)"
        )
    return frame


def _check_header(src: Source, header: list[str], required: Sequence[str]) -> None:
    seen = set()
    for name in header:
        if name in seen:
            raise TraceError(f"{src.display} line 1: column {name!r} appears twice in the header")
        seen.add(name)
    for name in required:
        if name not in seen:
            raise TraceError(
                f"{src.display} line 1: missing column {name!r} (expected columns "
                f"{', '.join(required)}; the header has {', '.join(header) or 'no columns'})"
            )


def _csv_fast(src: Source, header: list[str], wanted: list[str], types: dict[str, pl.DataType],
              numbered: bool) -> pl.DataFrame:
    # Without quote characters a record is exactly one line: split on commas, vectorised, over
    # the lines scanned from the file (the text is never held whole).
    parts = pl.col("text").str.split(",")
    lines = ["__line"] if numbered else []

    def field(name: str, typed: bool) -> pl.Expr:
        value = parts.list.get(header.index(name), null_on_oob=True)
        if typed and name in types:  # (as fields.whole_numbers and fields._floats parse text)
            value = value.str.strip_chars().cast(types[name], strict=False)
        return value.alias(name)

    def scan(typed: bool) -> pl.DataFrame:
        return (src.scan_lines().filter(pl.col("__line") > 1)
                .select(*lines, (parts.list.len() != len(header)).alias("__wrong"),
                        *(field(name, typed) for name in wanted))
                .collect(engine="streaming"))

    frame = scan(typed=True)
    if frame["__wrong"].any():
        index = int(frame["__wrong"].arg_true()[0])
        line = int(frame["__line"][index]) if numbered else line_of(src, header=True)(index)
        text = src.scan_lines().filter(pl.col("__line") == line).collect()["text"][0]
        _wrong_fields(src, line, header, len(text.split(",")), text)
    if any(frame[name].null_count() for name in types if name in wanted):
        frame = scan(typed=False)  # a value that needs the checkers' slower reading, or a bad one
    return frame.drop("__wrong")


def _csv_slow(src: Source, header: list[str], wanted: list[str]) -> pl.DataFrame:
    # Quoted fields may hold commas and line endings: Python's csv reader, streamed over the
    # text (`_text_stream`: the file's own lines are never held whole) and kept a chunk of
    # records at a time as String columns, not as lists of every value.
    positions = [header.index(name) for name in wanted]
    parts: list[pl.DataFrame] = []
    lines: list[int] = []
    values: list[list[str]] = [[] for _ in wanted]

    def flush() -> None:
        parts.append(pl.DataFrame({"__line": pl.Series(lines, dtype=pl.Int64),
                                   **{name: pl.Series(name, column, dtype=pl.String)
                                      for name, column in zip(wanted, values)}}))
        lines.clear()
        for column in values:
            column.clear()

    with _text_stream(src) as text:
        reader = csv.reader(text)
        next(reader, None)
        end = reader.line_num
        for record in reader:
            start, end = end + 1, reader.line_num
            if not record or (len(record) == 1 and not record[0].strip()):
                continue
            if len(record) != len(header):
                _wrong_fields(src, start, header, len(record), ",".join(record))
            lines.append(start)
            for column, position in zip(values, positions):
                column.append(record[position])
            if len(lines) == SLOW_CHUNK:
                flush()
    flush()
    return pl.concat(parts, rechunk=False)  # (no second copy of the columns at the end)


def _text_stream(src: Source) -> io.TextIOBase:
    """The text as csv reads it (newline="": its own line endings), decoded as it is read: from the
    file when it is scannable, from the held bytes when they are its lines as they are (a
    gzip's), else the text the source decoded (a BOM or CR line endings: held already)."""
    if src.scannable:
        return open(src.path, encoding="utf-8", newline="")  # noqa: SIM115 - the caller's `with` closes it
    if src.plain:
        return io.TextIOWrapper(io.BytesIO(src.held), encoding="utf-8", newline="")
    return io.StringIO(src.text, newline="")


def _wrong_fields(src: Source, line: int, header: list[str], found: int, text: str) -> None:
    raise TraceError(
        f"{src.display} line {line}: expected {len(header)} fields ({','.join(header)}), "
        f"found {found}: {show(text)}"
    )


def read_jsonl(
    src: Source, schema: dict[str, pl.DataType], required: Sequence[str], numbered: bool = True
) -> pl.DataFrame:
    """Keys of `schema` from a JSON-lines file; `required` keys must be present and not null."""
    lines = src.scan_lines()
    # polars keeps the first of a repeated key and Python's json the last: a line that may repeat
    # one takes the slow pass, which refuses it, so both paths give one answer.
    repeat = pl.any_horizontal([_may_repeat(pl.col("text"), key) for key in schema])
    if numbered:
        numbers = lines.select("__line", repeat.alias("__repeat")).collect(engine="streaming")
        count, repeats = numbers.height, bool(numbers["__repeat"].any())
    else:  # the lines counted, not numbered
        count, repeats = lines.select(pl.len(), repeat.any()).collect(engine="streaming").row(0)
    try:
        frame = pl.scan_ndjson(src.path, schema=schema).collect() if src.scannable else \
            pl.read_ndjson(io.BytesIO(src.data), schema=schema)
        fast = frame.height == count and not any(frame[k].null_count() for k in required)
    except pl.exceptions.PolarsError:
        fast = False
    if fast and not repeats:
        return frame.with_columns(numbers["__line"]) if numbered else frame
    # Slow pass: either raises naming the line, or yields text values the checkers judge.
    text = src.lines()
    return _jsonl_slow(src, text, schema, required).with_columns(text["__line"])


def _jsonl_slow(
    src: Source, lines: pl.DataFrame, schema: dict[str, pl.DataType], required: Sequence[str]
) -> pl.DataFrame:
    values: dict[str, list] = {key: [] for key in schema}
    for number, text in lines.iter_rows():
        try:
            row = json.loads(text, parse_int=_parse_int, object_pairs_hook=_unique_keys(schema))
        except _RepeatedKey as exc:
            raise TraceError(
                f"{src.display} line {number}: key {exc.args[0]!r} appears twice (expected each key once)"
            ) from None
        except json.JSONDecodeError as exc:
            raise TraceError(
                f"{src.display} line {number}: invalid JSON ({exc.msg} at column {exc.colno}): "
                f"{show(text)}"
            ) from None
        except RecursionError:
            raise TraceError(f"{src.display} line {number}: JSON nested too deeply (expected a flat object)") from None
        if not isinstance(row, dict):
            raise TraceError(
                f"{src.display} line {number}: expected a JSON object, found {show(text)}"
            )
        for key in required:
            if key not in row:
                raise TraceError(
                    f"{src.display} line {number}: missing key {key!r} (expected keys "
                    f"{', '.join(required)}; found {', '.join(row) or 'none'})"
                )
        for key, dtype in schema.items():
            value = row.get(key)
            if dtype == HASH_LIST and not _is_hash_list(value):
                raise TraceError(
                    f"{src.display} line {number}: {key}={show(json.dumps(value))} is not a list of "
                    "non-negative integers (expected prefix-block hash ids)"
                )
            if dtype == HASH_LIST:
                values[key].append(None if value is None else json.dumps(value))
            else:
                values[key].append(_json_text(value))
    return pl.DataFrame({key: pl.Series(key, column, dtype=pl.String) for key, column in values.items()})


def _may_repeat(text: pl.Expr, key: str) -> pl.Expr:
    return text.str.count_matches(f'"{re.escape(key)}"\\s*:') > 1


class _RepeatedKey(Exception):
    pass


def _unique_keys(schema: dict):
    def build(pairs: list[tuple[str, object]]) -> dict:
        seen = set()
        for key, _ in pairs:
            if key in seen and key in schema:
                raise _RepeatedKey(key)
            seen.add(key)
        return dict(pairs)

    return build


def _parse_int(text: str) -> int | str:
    # int() refuses more than 4300 digits; such a value stays text, which the checkers call too large.
    return int(text) if len(text) <= 100 else text


def _is_hash_list(value) -> bool:
    if value is None:
        return True
    return isinstance(value, list) and all(type(v) is int and 0 <= v < 2**64 for v in value)


def _json_text(value) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value)


def read_parquet(src: Source, required: Sequence[str], optional: Sequence[str] = (),
                 cast: dict[str, pl.DataType] | None = None, numbered: bool = True) -> pl.DataFrame:
    """Columns of a Parquet file as stored, or those of `cast` cast to its types as they are read
    when every value casts (strict); `__line` is the 1-based row number, when `numbered`."""
    present = parquet_columns(src)
    for name in required:
        if name not in present:
            raise TraceError(
                f"{src.display}: missing column {name!r} (the file has {', '.join(present)})"
            )
    wanted = [name for name in dict.fromkeys([*required, *optional]) if name in present]
    scan = pl.scan_parquet(src.parquet_source()).select(wanted)
    frame = None
    if cast:
        try:  # straight to the narrow types, so no wide copy of a column is held; else as stored
            frame = scan.cast({k: v for k, v in cast.items() if k in wanted}, strict=True).collect()
        except pl.exceptions.PolarsError:
            pass
    try:
        frame = scan.collect() if frame is None else frame
    except pl.exceptions.PolarsError as exc:
        raise TraceError(f"{src.display}: not a readable Parquet file ({_first_line(exc)})") from None
    if frame.height == 0:
        raise TraceError(f"{src.display}: no rows (expected at least one request)")
    if not numbered:
        return frame
    return frame.with_columns(pl.int_range(1, frame.height + 1, dtype=pl.Int64).alias("__line"))


def parquet_columns(src: Source) -> list[str]:
    try:
        return list(pl.read_parquet_schema(src.parquet_source()))
    except pl.exceptions.PolarsError as exc:
        raise TraceError(f"{src.display}: not a readable Parquet file ({_first_line(exc)})") from None


def _first_line(exc: Exception) -> str:
    return str(exc).strip().split("\n", 1)[0]
