"""Every adapter on small fixtures: columns, units, labels, detection, .gz, overrides, sorting."""

from __future__ import annotations

import gzip
import pathlib
import shutil

import polars as pl
import pytest

from common.errors import TraceError
import traces
from traces import TRACE_SCHEMA, detect_format, load_trace

FIX = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "traces"


def col(trace, name):
    return trace.frame[name].to_list()


def test_azure_2023_crlf_seven_digit_timestamps_no_trailing_newline():
    raw = (FIX / "azure_conv_2023_head.csv").read_bytes()
    assert b"\r\n" in raw and not raw.endswith(b"\n")
    trace = load_trace(FIX / "azure_conv_2023_head.csv")
    assert trace.format == "azure"
    assert dict(trace.frame.schema) == TRACE_SCHEMA
    # 18:15:46.6805900 -> 18:15:50.9951690 is 4.314579 s
    assert col(trace, "arrival_us")[:3] == [0, 4_314_579, 4_541_877]
    assert col(trace, "prompt_tokens")[:3] == [374, 396, 879]
    assert col(trace, "output_tokens")[:3] == [44, 109, 55]
    assert set(col(trace, "workload")) == {"conv"}
    assert set(col(trace, "tenant")) == {"default"}
    assert col(trace, "request_id") == list(range(8))
    assert trace.prefix_block_tokens is None and trace.dropped == {} and trace.reordered == 0


def test_azure_2024_utc_offsets_are_converted():
    trace = load_trace(FIX / "azure_code_2024_small.csv")
    assert trace.format == "azure"
    # the +02:00 row is 00:00:01.5 UTC
    assert col(trace, "arrival_us") == [0, 52_110, 990_070, 1_490_070, 2_740_070]
    assert set(col(trace, "workload")) == {"code"}


def test_mooncake_ms_timestamps_and_hashes():
    trace = load_trace(FIX / "mooncake_small.jsonl")
    assert trace.format == "mooncake" and trace.prefix_block_tokens == 512
    assert col(trace, "arrival_us") == [0, 0, 40_000, 1_000_000, 2_500_000, 2_500_000]
    assert col(trace, "prefix_hashes")[0] == [0, 1, 2]
    assert col(trace, "prompt_tokens") == [1030, 600, 1536, 200, 513, 1200]
    assert set(col(trace, "workload")) == {"mooncake"}
    assert load_trace(FIX / "mooncake_small.jsonl", prefix_block_tokens=16).prefix_block_tokens == 16


def test_burstgpt_drops_and_counts_failed_requests():
    trace = load_trace(FIX / "burstgpt_v1_small.csv")
    assert trace.format == "burstgpt"
    assert trace.dropped == {"zero_output_tokens": 2}
    assert col(trace, "arrival_us") == [0, 113_000_000, 135_000_000, 146_500_000]
    assert col(trace, "workload") == ["ChatGPT", "GPT-4", "GPT-4", "ChatGPT"]
    assert col(trace, "tenant") == ["Conversation log", "Conversation log", "API log", "Conversation log"]
    assert trace.frame["session_id"].null_count() == 4


def test_burstgpt_v2_session_ids():
    trace = load_trace(FIX / "burstgpt_v2_small.csv")
    assert trace.dropped == {"zero_output_tokens": 1}
    assert col(trace, "session_id") == ["s-1", "s-1", None]
    assert col(trace, "prompt_tokens") == [100, 240, 75]


def test_splitwise_float_seconds_round_to_microseconds():
    trace = load_trace(FIX / "splitwise_code_small.csv")
    assert trace.format == "splitwise"
    assert col(trace, "arrival_us") == [0, 52_000, 98_189, 199_961_506]
    assert set(col(trace, "workload")) == {"code"}


def test_vidur_extra_columns_and_reordering():
    trace = load_trace(FIX / "vidur_small.csv")
    assert trace.format == "vidur"
    assert col(trace, "arrival_us") == [0, 250_000, 500_000]
    assert col(trace, "prompt_tokens") == [100, 50, 300]
    assert trace.reordered == 1
    assert set(col(trace, "workload")) == {"vidur"}


def test_splitwise_and_vidur_read_the_same_columns():
    a = load_trace(FIX / "splitwise_code_small.csv", format="vidur")
    b = load_trace(FIX / "splitwise_code_small.csv")
    assert a.frame.drop("workload").equals(b.frame.drop("workload"))


GENERIC_MAP = {
    "arrival": "ts_ms", "prompt_tokens": "in", "output_tokens": "out", "workload": "cls",
    "tenant": "user", "priority": "prio", "session_id": "conv", "adapter": "lora",
    "prefix_hashes": "blocks",
}  # fmt: skip


def test_generic_csv_with_every_column():
    trace = load_trace(FIX / "generic_small.csv", column_map=GENERIC_MAP, time_unit="ms",
                       prefix_block_tokens=16)
    assert trace.format == "csv" and trace.prefix_block_tokens == 16
    assert col(trace, "arrival_us") == [0, 250_000, 500_000]
    assert col(trace, "workload") == ["chat", "batch", "chat"]
    assert col(trace, "tenant") == ["acme", "acme", "globex"]
    assert col(trace, "priority") == [0, 5, -1]
    assert col(trace, "session_id") == ["c1", None, "c1"]
    assert col(trace, "adapter") == [None, "lora-a", "lora-b"]
    assert col(trace, "prefix_hashes") == [[1, 2], None, [1, 2, 3]]


def test_generic_csv_needs_block_size_for_hashes():
    with pytest.raises(TraceError, match="prefix_block_tokens"):
        load_trace(FIX / "generic_small.csv", column_map=GENERIC_MAP, time_unit="ms")


@pytest.mark.parametrize("unit, scale", [("s", 1_000_000), ("ms", 1_000), ("us", 1)])
def test_generic_time_units(tmp_path, unit, scale):
    path = tmp_path / "t.csv"
    path.write_text("when,p,o\n0,5,1\n2,5,1\n3,5,1\n")
    trace = load_trace(path, column_map={"arrival": "when", "prompt_tokens": "p", "output_tokens": "o"},
                       time_unit=unit)
    assert col(trace, "arrival_us") == [0, 2 * scale, 3 * scale]
    assert set(col(trace, "workload")) == {"t"}  # default label: the file's stem


def test_generic_jsonl_datetimes_and_defaults():
    cmap = {"arrival": "t", "prompt_tokens": "p", "output_tokens": "o", "tenant": "tenant",
            "session_id": "sess"}
    trace = load_trace(FIX / "generic_small.jsonl", column_map=cmap, time_unit="datetime")
    assert trace.format == "jsonl"
    assert col(trace, "arrival_us") == [0, 250_000, 1_000_000]
    assert col(trace, "session_id") == ["17", None, "x"]
    assert col(trace, "workload") == ["generic_small"] * 3


def test_generic_parquet(tmp_path):
    path = tmp_path / "g.parquet"
    pl.DataFrame({"t": [0.0, 1.5, 0.75], "p": [10, 20, 30], "o": [1, 2, 3],
                  "h": [[1, 2], None, [1]]}).write_parquet(path)
    assert detect_format(path) == "parquet"
    cmap = {"arrival": "t", "prompt_tokens": "p", "output_tokens": "o", "prefix_hashes": "h"}
    trace = load_trace(path, column_map=cmap, prefix_block_tokens=64, workload="batch")
    assert col(trace, "arrival_us") == [0, 750_000, 1_500_000]
    assert col(trace, "prefix_hashes") == [[1, 2], [1], None]
    assert trace.reordered == 1
    assert set(col(trace, "workload")) == {"batch"}


@pytest.mark.parametrize("name, fmt", [
    ("azure_conv_2023_head.csv", "azure"),
    ("azure_code_2024_small.csv", "azure"),
    ("mooncake_small.jsonl", "mooncake"),
    ("burstgpt_v1_small.csv", "burstgpt"),
    ("burstgpt_v2_small.csv", "burstgpt"),
    ("splitwise_code_small.csv", "splitwise"),
    ("vidur_small.csv", "vidur"),
])  # fmt: skip
def test_detect_format(name, fmt):
    assert detect_format(FIX / name) == fmt


def test_detect_format_of_bundled_names():
    assert detect_format("azure-conv-2023") == "azure"
    assert detect_format("mooncake-synthetic") == "mooncake"


def test_gzip_is_read_transparently_and_hash_is_of_file_bytes(tmp_path):
    plain = FIX / "mooncake_small.jsonl"
    packed = tmp_path / "mooncake_small.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    a, b = load_trace(plain), load_trace(packed)
    assert a.frame.equals(b.frame)
    assert detect_format(packed) == "mooncake"
    assert a.sha256 != b.sha256
    import hashlib

    assert b.sha256 == hashlib.sha256(packed.read_bytes()).hexdigest()


def test_explicit_format_overrides_detection(tmp_path):
    # header order differs from Azure's but the columns are Azure's; also a different stem
    path = tmp_path / "trace.csv"
    path.write_text("ContextTokens,TIMESTAMP,GeneratedTokens,extra\n5,2023-11-16 18:00:00.5,2,x\n")
    assert detect_format(path) == "azure"
    trace = load_trace(path, format="azure", workload="chat")
    assert col(trace, "workload") == ["chat"]
    assert col(trace, "prompt_tokens") == [5]


def test_workload_override_replaces_every_label():
    trace = load_trace(FIX / "burstgpt_v1_small.csv", workload="burst")
    assert set(col(trace, "workload")) == {"burst"}


def test_unsorted_rows_are_sorted_stably_and_counted():
    trace = load_trace(FIX / "unsorted.csv")
    assert trace.reordered == 2
    assert col(trace, "arrival_us") == [0, 500_000, 1_000_000, 2_000_000, 3_000_000]
    assert col(trace, "prompt_tokens") == [10, 50, 30, 20, 40]
    assert col(trace, "request_id") == [0, 1, 2, 3, 4]


def test_equal_arrivals_keep_file_order():
    trace = load_trace(FIX / "mooncake_small.jsonl")
    assert col(trace, "prompt_tokens")[:2] == [1030, 600]
    assert trace.reordered == 0


def test_strict_rejects_unsorted():
    with pytest.raises(TraceError) as err:
        load_trace(FIX / "unsorted.csv", strict=True)
    msg = str(err.value)
    assert "unsorted.csv line 4:" in msg and "line 3" in msg and "2 rows out of order" in msg


def test_first_arrival_is_zero_when_trace_starts_late(tmp_path):
    path = tmp_path / "late.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n100.5,1,1\n101,1,1\n")
    assert col(load_trace(path), "arrival_us") == [0, 500_000]


def test_quoted_csv_fields_take_the_python_csv_path(tmp_path):
    path = tmp_path / "q.csv"
    path.write_text('Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n'
                    '1,"Chat, GPT",10,2,12,"API log"\n\n2,GPT-4,5,1,6,API log\n')
    trace = load_trace(path)
    assert col(trace, "workload") == ["Chat, GPT", "GPT-4"]


@pytest.mark.parametrize("kind", ["plain", "gzip", "bom", "cr"])
def test_a_quoted_csv_is_read_a_chunk_of_records_at_a_time_without_its_text(tmp_path, kind, monkeypatch):
    import gzip

    import traces.tables
    from traces.source import open_source

    monkeypatch.setattr(traces.tables, "SLOW_CHUNK", 4096)
    n = 40_000  # past the 1 MiB head a source keeps (a smaller file is decoded whole anyway)
    rows = [f'{t},"Chat, GPT {t}",{10 + t},2,12,"API\nlog"' if t % 3 else f"{t},GPT-4,{10 + t},1,6,API log"
            for t in range(n)]
    text = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n" + "\n".join(rows) + "\n"
    data = text.replace("\n", "\r") if kind == "cr" else text
    data = ("\ufeff" if kind == "bom" else "") + data
    path = tmp_path / ("q.csv.gz" if kind == "gzip" else "q.csv")
    path.write_bytes(gzip.compress(data.encode()) if kind == "gzip" else data.encode())
    trace = load_trace(path)
    assert col(trace, "workload") == [f"Chat, GPT {t}" if t % 3 else "GPT-4" for t in range(n)]
    assert col(trace, "prompt_tokens") == [10 + t for t in range(n)]
    source = open_source(path)
    traces.tables.read_csv(source, ["Timestamp", "Model"])
    assert kind in ("bom", "cr") or "text" not in source.__dict__  # (those two hold their decoded text)


def test_whole_number_floats_are_accepted(tmp_path):
    path = tmp_path / "f.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,12.0,3\n1,1e3,4\n")
    assert col(load_trace(path), "prompt_tokens") == [12, 1000]


def test_bundled_name_and_copy_load_alike(tmp_path):
    copy = tmp_path / "AzureLLMInferenceTrace_code.csv"
    shutil.copy(traces.bundled_trace_path("azure-code-2023"), copy)
    a, b = load_trace("azure-code-2023"), load_trace(copy)
    assert a.source == "azure-code-2023" and b.source == str(copy)
    assert a.frame.equals(b.frame) and a.sha256 == b.sha256
