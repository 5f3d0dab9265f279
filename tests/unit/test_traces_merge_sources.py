"""A merge source's own window, rate_scale and sample apply to it alone, before the merge."""

from traces import MergeSource, SampleConfig, TraceConfig, WindowConfig, load_from_config, load_trace


def test_each_merge_source_is_transformed_alone():
    code = load_trace("azure-code-2023").frame
    cfg = TraceConfig(
        path="azure-conv-2023", workload="chat", window=WindowConfig(end_s=600),
        merge=(MergeSource(path="azure-code-2023", workload="batch", sample=SampleConfig(fraction=0.5, seed=3),
                           rate_scale=2.0),),
    )
    mixed = load_from_config(cfg).frame
    batch = mixed.filter(mixed["workload"] == "batch")
    chat = mixed.filter(mixed["workload"] == "chat")
    # Half the code trace, at twice its rate (so its span halves), then the 600 s window on the mix.
    assert abs(batch.height - round(0.5 * code.filter(code["arrival_us"] < 1_200_000_000).height)) < 60
    assert chat["arrival_us"].max() < 600_000_000 and batch["arrival_us"].max() < 600_000_000
    assert mixed["arrival_us"].is_sorted()


def test_a_bad_merge_source_transform_names_its_key():
    import pytest

    from replay.config import load_config
    from common.errors import ConfigError

    import pathlib
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = pathlib.Path(d) / "f.yaml"
        p.write_text("trace:\n  merge:\n    - {path: azure-code-2023, rate_scale: -1}\n")
        with pytest.raises(ConfigError, match=r"trace\.merge\[0\]"):
            load_config(p)
