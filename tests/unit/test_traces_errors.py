"""Every kind of bad trace input is one TraceError naming the file, the line and the value."""

from __future__ import annotations

import gzip
import pathlib

import polars as pl
import pytest

from common.errors import TraceError, UserError
from traces import detect_format, load_trace

FIX = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "traces"
AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
ROW = "2023-11-16 18:15:46.6805900,374,44\r\n"
MC = '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}\n'


def error(path, **kw) -> str:
    with pytest.raises(TraceError) as err:
        load_trace(path, **kw)
    assert isinstance(err.value, UserError)
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message
    return message


CASES = {
    # name: (content, expected fragments)
    "fraction.csv": (AZ + ROW * 5 + "2023-11-16 18:15:47.0,12.5,3\r\n",
                     ["fraction.csv line 7: ContextTokens='12.5' is not a whole number "
                      "(expected a non-negative integer token count)"]),
    "negative.csv": (AZ + ROW + "2023-11-16 18:15:47.0,-3,3\r\n",
                     ["negative.csv line 3:", "ContextTokens='-3' is negative"]),
    "nan.csv": (AZ + ROW + "2023-11-16 18:15:47.0,5,NaN\r\n",
                ["nan.csv line 3:", "GeneratedTokens='NaN' is not a finite number"]),
    "text.csv": (AZ + ROW + "2023-11-16 18:15:47.0,abc,3\r\n",
                 ["text.csv line 3:", "ContextTokens='abc' is not a number"]),
    "empty_value.csv": (AZ + ROW + "2023-11-16 18:15:47.0,,3\r\n",
                        ["empty_value.csv line 3:", "ContextTokens='' is empty"]),
    "zero_prompt.csv": (AZ + ROW + "2023-11-16 18:15:47.0,0,3\r\n",
                        ["zero_prompt.csv line 3:", "ContextTokens='0' is zero"]),
    "zero_output.csv": (AZ + ROW + "2023-11-16 18:15:47.0,3,0\r\n",
                        ["zero_output.csv line 3:", "GeneratedTokens='0' is zero"]),
    "huge.csv": (AZ + ROW + "2023-11-16 18:15:47.0,3000000000,1\r\n",
                 ["huge.csv line 3:", "'3000000000' is too large"]),
    "bad_date.csv": (AZ + ROW + "2023-13-16 18:15:47.0,3,4\r\n",
                     ["bad_date.csv line 3:", "TIMESTAMP='2023-13-16 18:15:47.0' is not a valid timestamp",
                      "expected a timestamp like '2023-11-16 18:15:46.6805900'"]),
    "word_date.csv": (AZ + ROW + "yesterday,3,4\r\n",
                      ["word_date.csv line 3:", "TIMESTAMP='yesterday'"]),
    "short_row.csv": (AZ + ROW + "2023-11-16 18:15:47.0,3\r\n",
                      ["short_row.csv line 3: expected 3 fields (TIMESTAMP,ContextTokens,GeneratedTokens), "
                       "found 2: '2023-11-16 18:15:47.0,3'"]),
    "long_row.csv": (AZ + ROW + "2023-11-16 18:15:47.0,3,4,5\r\n",
                     ["long_row.csv line 3: expected 3 fields", "found 4"]),
    "quoted_short.csv": (AZ + ROW + '"2023-11-16 18:15:47.0",3,"4"\r\n"2023-11-16 18:15:48.0",3\r\n',
                         ["quoted_short.csv line 4: expected 3 fields", "found 2"]),
    "blank_lines.csv": (AZ + ROW + "\r\n\r\n2023-11-16 18:15:47.0,x,4\r\n",
                        ["blank_lines.csv line 5:", "ContextTokens='x'"]),
    "earliest.csv": (AZ + ROW + "2023-11-16 18:15:47.0,3,zz\r\n2023-11-16 18:15:48.0,-1,4\r\n",
                     ["earliest.csv line 3:", "GeneratedTokens='zz'"]),
    "header_only.csv": (AZ, ["header_only.csv:", "no requests"]),
    "empty.csv": ("", ["empty.csv: file is empty"]),
    "spaces.jsonl": ("\n  \n", ["spaces.jsonl: file is empty"]),
    "broken.jsonl": (MC + '{"timestamp": 1, "input_length": 5\n',
                     ["broken.jsonl line 2: invalid JSON", '{"timestamp": 1, "input_length": 5']),
    "list_line.jsonl": (MC + "[1, 2]\n", ["list_line.jsonl line 2: expected a JSON object, found '[1, 2]'"]),
    "missing_key.jsonl": (MC + "\n" + '{"timestamp": 1, "output_length": 1}\n',
                          ["missing_key.jsonl line 3: missing key 'input_length'"]),
    "fraction.jsonl": (MC + '{"timestamp": 1, "input_length": 5.5, "output_length": 1}\n',
                       ["fraction.jsonl line 2: input_length='5.5' is not a whole number"]),
    "bool.jsonl": (MC + '{"timestamp": 1, "input_length": true, "output_length": 1}\n',
                   ["bool.jsonl line 2: input_length='true' is not a number"]),
    "null.jsonl": (MC + '{"timestamp": 1, "input_length": 4, "output_length": null}\n',
                   ["null.jsonl line 2: output_length=null is missing"]),
    "bad_time.jsonl": (MC + '{"timestamp": "soon", "input_length": 5, "output_length": 1}\n',
                       ["bad_time.jsonl line 2: timestamp='soon' is not a number",
                        "expected milliseconds"]),
    "nan_time.jsonl": (MC + '{"timestamp": NaN, "input_length": 5, "output_length": 1}\n',
                       ["nan_time.jsonl line 2: timestamp='nan' is not a finite number"]),
    "neg_hash.jsonl": (MC + '{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": [0, -1]}\n',
                       ["neg_hash.jsonl line 2: hash_ids='[0, -1]' is not a list of non-negative integers"]),
    "str_hash.jsonl": (MC + '{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": "abc"}\n',
                       ["str_hash.jsonl line 2: hash_ids="]),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_text_input(tmp_path, name):
    content, fragments = CASES[name]
    path = tmp_path / name
    path.write_bytes(content.encode())
    fmt = "mooncake" if name.endswith(".jsonl") else None
    message = error(path, format=fmt)
    for fragment in fragments:
        assert fragment in message, message


def test_unknown_format_lists_the_known_ones():
    message = error(FIX / "vidur_small.csv", format="splitwize")
    assert "unknown trace format 'splitwize'" in message
    assert ("aiperf, azure, blis, burstgpt, csv, genai-perf, inference-perf, jsonl, litellm, mooncake, "
            "parquet, splitwise, vidur") in message


@pytest.mark.parametrize("content, shown", [
    ("a,b,c\n1,2,3\n", "line 1 is 'a,b,c'"),
    ('{"a": 1}\n', "line 1 is '{\"a\": 1}'"),
    ("hello world\n", "line 1 is 'hello world'"),
])  # fmt: skip
def test_undetectable_format_shows_first_line_and_formats(tmp_path, content, shown):
    path = tmp_path / "mystery.txt"
    path.write_text(content)
    for call in (lambda: load_trace(path), lambda: detect_format(path)):
        with pytest.raises(TraceError) as err:
            call()
        message = str(err.value)
        assert message.startswith(f"{path}: cannot detect the trace format")
        assert shown in message and "mooncake" in message and "burstgpt" in message


def test_missing_column_with_explicit_format(tmp_path):
    path = tmp_path / "az.csv"
    path.write_text("TIMESTAMP,ContextTokens,Generated\n2023-11-16 18:15:47.0,3,4\n")
    message = error(path, format="azure")
    assert "az.csv line 1: missing column 'GeneratedTokens'" in message
    assert "TIMESTAMP, ContextTokens, Generated" in message


def test_missing_mapped_column(tmp_path):
    path = tmp_path / "g.csv"
    path.write_text("t,p,o\n1,2,3\n")
    message = error(path, column_map={"arrival": "t", "prompt_tokens": "p", "output_tokens": "out"})
    assert "g.csv line 1: missing column 'out'" in message


def test_bad_column_map_and_time_unit(tmp_path):
    path = tmp_path / "g.csv"
    path.write_text("t,p,o\n1,2,3\n")
    cmap = {"arrival": "t", "prompt_tokens": "p", "output_tokens": "o"}
    assert "unknown key 'tokens'" in error(path, column_map={**cmap, "tokens": "p"})
    assert "'output_tokens' is missing" in error(path, column_map={"arrival": "t", "prompt_tokens": "p"})
    message = error(path, column_map=cmap, time_unit="h")
    assert "time_unit 'h' is not known; known: s, ms, us, datetime" in message
    assert "needs a column_map" in error(path, format="csv")
    assert "apply to the csv, jsonl and parquet formats only" in error(
        FIX / "vidur_small.csv", time_unit="ms")


def test_generic_time_errors(tmp_path):
    path = tmp_path / "g.csv"
    path.write_text("t,p,o\n1,2,3\nlater,2,3\n")
    cmap = {"arrival": "t", "prompt_tokens": "p", "output_tokens": "o"}
    assert "g.csv line 3: t='later' is not a number (expected seconds)" in error(path, column_map=cmap)
    path.write_text("t,p,o\n2024-01-01 00:00:00,2,3\nnot a date,2,3\n")
    assert "g.csv line 3: t='not a date' is not a valid timestamp" in error(
        path, column_map=cmap, time_unit="datetime")


def test_truncated_gzip(tmp_path):
    data = gzip.compress((FIX / "mooncake_small.jsonl").read_bytes())
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    message = error(path)
    assert message.startswith(f"{path}: truncated or corrupt gzip data")


def test_binary_file(tmp_path):
    path = tmp_path / "blob.bin"
    path.write_bytes(bytes(range(256)) * 4)
    assert error(path) == f"{path}: not a text file (byte 0x00 at offset 0); expected CSV, JSONL or Parquet"
    path.write_bytes(b"\xff\xfe\xfa" * 100)
    assert "not a text file (byte 0xff at offset 0" in error(path)


def test_invalid_utf8_late_in_file_names_the_line(tmp_path):
    path = tmp_path / "latin.csv"
    path.write_bytes((AZ + ROW * 600).encode() + "2023-11-16 18:15:47.0,3,4\xe9\r\n".encode("latin-1"))
    assert error(path) == f"{path} line 602: byte 0xe9 is not valid UTF-8 (expected UTF-8 text)"


def test_missing_file_and_directory(tmp_path):
    message = error(tmp_path / "nope.csv")
    assert message.startswith(f"{tmp_path / 'nope.csv'}: file not found")
    assert "azure-conv-2023" in message
    assert error(tmp_path) == f"{tmp_path}: is a directory (expected a trace file)"


def test_parquet_errors_name_the_row(tmp_path):
    path = tmp_path / "bad.parquet"
    pl.DataFrame({"t": [0.0, 1.0], "p": [10, -2], "o": [1.0, 2.5]}).write_parquet(path)
    cmap = {"arrival": "t", "prompt_tokens": "p", "output_tokens": "o"}
    assert error(path, column_map=cmap).startswith(f"{path} row 2: p=-2 is negative")
    assert "missing column 'x' (the file has t, p, o)" in error(path, column_map={**cmap, "tenant": "x"})
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(path.read_bytes()[:60])
    assert error(cut, column_map=cmap).startswith(f"{cut}: not a readable Parquet file")


def test_burstgpt_all_failed(tmp_path):
    path = tmp_path / "b.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "1,ChatGPT,5,0,5,API log\n")
    assert "every request has 0 response tokens" in error(path)


def test_burstgpt_zero_prompt_is_an_error_but_zero_response_is_dropped(tmp_path):
    path = tmp_path / "b.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "1,ChatGPT,5,0,5,API log\n2,ChatGPT,0,3,3,API log\n")
    assert error(path).startswith(f"{path} line 3: Request tokens='0' is zero")
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "1,ChatGPT,5,-1,5,API log\n")
    assert error(path).startswith(f"{path} line 2: Response tokens='-1' is negative")


def test_errors_are_user_errors():
    assert issubclass(TraceError, UserError)
