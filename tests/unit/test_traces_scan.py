"""A plain trace file is scanned from disk, not held: the same frames and the same bad-input
messages as a held copy of the same bytes (a gzip of it), whatever the chunk boundaries."""

from __future__ import annotations

import gzip
import pathlib

import polars as pl
import pytest

import traces.source as source
from common.errors import TraceError
from traces import load_trace
from traces.source import open_source

VIDUR = "arrived_at,num_prefill_tokens,num_decode_tokens\n"
CMAP = {"arrival": "t", "prompt_tokens": "p", "output_tokens": "o"}


def write_both(tmp_path: pathlib.Path, name: str, content: bytes) -> tuple[pathlib.Path, pathlib.Path]:
    plain = tmp_path / name
    plain.write_bytes(content)
    packed = tmp_path / f"{name}.gz"
    packed.write_bytes(gzip.compress(content))
    return plain, packed


def outcome(path: pathlib.Path, **kw) -> pl.DataFrame | str:
    try:
        return load_trace(path, **kw).frame
    except TraceError as exc:
        return str(exc).replace(".gz", "").replace(f"{path.parent}/", "")


def same(tmp_path: pathlib.Path, name: str, content: bytes, **kw) -> pl.DataFrame | str:
    plain, packed = write_both(tmp_path, name, content)
    a, b = outcome(plain, **kw), outcome(packed, **kw)
    if isinstance(a, str) or isinstance(b, str):
        assert a == b
    else:
        assert a.equals(b)
    return a


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 7 bytes and a head of 64: every boundary case on a few lines of input."""
    monkeypatch.setattr(source, "_CHUNK_BYTES", 7)
    monkeypatch.setattr(source, "_HEAD_BYTES", 64)


def test_a_plain_csv_is_scanned_not_held(tmp_path):
    rows = "".join(f"{i * 0.5},{10 + i},{1 + i % 3}\n" for i in range(50))
    path = tmp_path / "t.csv"
    path.write_text(VIDUR + rows)
    assert open_source(path).held is None
    frame = same(tmp_path, "t.csv", (VIDUR + rows).encode())
    assert frame["prompt_tokens"].to_list() == [10 + i for i in range(50)]


@pytest.mark.parametrize("ending", ["\n", "\r\n"])
def test_line_numbers_past_the_head_and_across_chunks(tmp_path, small_chunks, ending):
    rows = [f"{i},{5 + i},2" for i in range(40)]
    rows[30] = "30,-4,2"
    text = ending.join([VIDUR.strip(), *rows[:10], "", "  ", *rows[10:]]) + ending
    message = same(tmp_path, "t.csv", text.encode())
    assert message == "t.csv line 34: num_prefill_tokens='-4' is negative (expected a non-negative integer token count)"


def test_a_short_row_past_the_head_is_named_with_its_text(tmp_path, small_chunks):
    text = VIDUR + "".join(f"{i},5,2\n" for i in range(30)) + "31,5\n"
    message = same(tmp_path, "t.csv", text.encode())
    assert message.startswith("t.csv line 32: expected 3 fields") and message.endswith("found 2: '31,5'")


@pytest.mark.parametrize("odd", ["1,2\r3\n", "\ufeff", "x\x00y\n", "4,5,6\r"])
def test_bytes_the_scans_would_read_otherwise_are_held(tmp_path, odd):
    path = tmp_path / "t.csv"
    rows = "0,5,2\n" * 2000  # a NUL past the first 8 KiB, which refuse binary files outright
    path.write_bytes((("\ufeff" + VIDUR + rows) if odd == "\ufeff" else (VIDUR + rows + odd)).encode())
    assert open_source(path).held is not None
    same(tmp_path, "u.csv", path.read_bytes())


def test_invalid_utf8_past_the_first_chunks_names_its_line(tmp_path, small_chunks):
    content = (VIDUR + "0,5,2\n1,5,2\n# caf\u00e9\n").encode() + b"2,\xff,2\n"
    assert same(tmp_path, "t.csv", content) == "t.csv line 5: byte 0xff is not valid UTF-8 (expected UTF-8 text)"


def test_a_character_cut_at_the_end_of_the_file(tmp_path, small_chunks):
    content = (VIDUR + "0,5,2\n").encode() + "\u00e9".encode()[:1]
    assert same(tmp_path, "t.csv", content) == "t.csv line 3: byte 0xc3 is not valid UTF-8 (expected UTF-8 text)"


def test_jsonl_past_the_head(tmp_path, small_chunks):
    lines = [f'{{"t": {i}, "p": {3 + i}, "o": 1}}' for i in range(30)]
    frame = same(tmp_path, "t.jsonl", ("\n".join(lines[:5] + [""] + lines[5:]) + "\n").encode(), column_map=CMAP)
    assert frame["prompt_tokens"].to_list() == [3 + i for i in range(30)]
    lines[20] = '{"t": 20, "p": 3, "p": 4, "o": 1}'
    message = same(tmp_path, "u.jsonl", ("\n".join(lines) + "\n").encode(), column_map=CMAP)
    assert message == "u.jsonl line 21: key 'p' appears twice (expected each key once)"


def test_mooncake_detected_from_a_first_object_longer_than_the_head(tmp_path, small_chunks):
    row = '{"timestamp": %d, "input_length": 600, "output_length": 2, "hash_ids": [%s]}\n'
    content = "".join(row % (i, ", ".join(str(h) for h in range(30))) for i in range(3)).encode()
    frame = same(tmp_path, "m.jsonl", content)
    assert frame.height == 3 and frame["prefix_hashes"][0].to_list() == list(range(30))


def test_a_file_changed_after_it_was_opened(tmp_path, small_chunks):
    path = tmp_path / "t.csv"
    path.write_text(VIDUR + "".join(f"{i},5,2\n" for i in range(30)))
    src = open_source(path)
    path.write_text(VIDUR + "".join(f"{i},6,2\n" for i in range(30)))
    with pytest.raises(TraceError, match="changed while it was read"):
        src.text


def test_canonical_parquet_is_read_straight_into_its_types(tmp_path):
    from traces.canonical import write_canonical

    frame = load_trace("azure-conv-2023").frame
    path = tmp_path / "c.parquet"
    write_canonical(frame, path, None)
    assert open_source(path).held is None
    assert same(tmp_path, "c.parquet", path.read_bytes()).equals(frame)
    wide = frame.with_columns(pl.col("prompt_tokens").cast(pl.Int64) + 2**31)  # cannot be int32
    wide.write_parquet(path)
    message = outcome(path)
    assert message == "c.parquet: column 'prompt_tokens' of type Int64 cannot be cast to Int32"


def test_numbers_that_need_the_slower_reading_load_as_before(tmp_path):
    rows = "".join(f"{i}.0 , {5 + i}.0,+{1 + i % 3}\n" for i in range(20))
    frame = same(tmp_path, "t.csv", (VIDUR + rows).encode())
    assert frame["prompt_tokens"].to_list() == [5 + i for i in range(20)]
    label = {"arrival": "t", "prompt_tokens": "p", "output_tokens": "p", "workload": "p"}
    frame = same(tmp_path, "g.csv", b"t,p\n0,+07\n1,8\n", column_map=label)
    assert frame["workload"].to_list() == ["+07", "8"] and frame["output_tokens"].to_list() == [7, 8]


@pytest.mark.parametrize(("name", "content", "kw", "expected"), [
    ("t.csv", "t,p,o\n1,10,5\n\n\n2,0,5\n", {"column_map": CMAP}, "t.csv line 5: p='0' is zero (expected at least 1 token)"),
    ("t.jsonl", '{"t":1,"p":1,"o":5}\n\n{"t":2,"p":"x","o":5}\n', {"column_map": CMAP},
     "t.jsonl line 3: p='x' is not a number (expected a non-negative integer token count)"),
    # the rows after a dropped one (0 response tokens) keep their lines
    ("b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n1,m,10,0,10,x\n\n2,m,10,5,15,x\n"
     "99999999999,m,3,5,8,x\n", {},
     "b.csv line 5 arrives at 99,999,999,999 s, 3169 years after line 4 (2 s): the trace would span 3169 years, more "
     "than the bound of 31 days (check the arrival column's time unit; --max-span-s raises the bound)"),
    # the widest gap is named in arrival order, by the rows' lines in the file
    ("s.csv", VIDUR + "5e9,1,1\n\n0.5,1,1\n0.1,1,1\n", {},
     "s.csv line 2 arrives at 5,000,000,000 s, 158 years after line 4 (0.5 s): the trace would span 158 years, more "
     "than the bound of 31 days (check the arrival column's time unit; --max-span-s raises the bound)"),
])
def test_a_row_read_without_its_line_number_is_named_by_its_line(tmp_path, name, content, kw, expected):
    assert same(tmp_path, name, content.encode(), **kw) == expected
