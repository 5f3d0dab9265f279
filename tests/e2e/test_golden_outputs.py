"""What a user gets from the bundled traces and the incident demo does not change unless meant
(see tests/golden.py: content digests of every output file, rewritten with --write)."""

from __future__ import annotations

import pytest

from tests import golden


@pytest.mark.parametrize("name", sorted(golden.RUNS))
def test_outputs_match_the_golden_digests(name, tmp_path):
    expected = golden.load()[name]
    got = golden.replay(name, tmp_path)
    assert sorted(got) == sorted(expected), "the run's files differ"
    changed = [f for f in expected if got[f] != expected[f]]
    assert not changed, f"{name}: {', '.join(changed)} changed (python tests/golden.py --write if meant)"


def test_the_digest_sees_a_changed_value(tmp_path):
    import polars as pl

    path = tmp_path / "x.parquet"
    pl.DataFrame({"a": [1, 2, None], "s": ["x", None, "z"]}).write_parquet(path)
    before = golden.file_digest(path)
    pl.DataFrame({"a": [1, 3, None], "s": ["x", None, "z"]}).write_parquet(path)
    changed = golden.file_digest(path)
    assert changed != before
    # The same content written another way (compression, row groups) is the same digest.
    pl.DataFrame({"a": [1, 3, None], "s": ["x", None, "z"]}).write_parquet(path, compression="gzip", row_group_size=1)
    assert golden.file_digest(path) == changed
