"""Content digests of the runs a user gets from the bundled traces and the incident demo.

A refactor must not change what a user sees. `tests/e2e/test_golden_outputs.py` replays each run
below and compares its files with `tests/fixtures/golden/digests.json`. The digests are of the
content, not the bytes on disk, so that a new polars that writes Parquet metadata differently
does not read as a change: each Parquet file is hashed column by column (name, dtype, the values'
little-endian bytes and the null mask), JSON after sorting its keys, text as it is. `timing.json`
(wall-clock seconds) is left out.

A change of behaviour that is meant (a fix, a new output column) rewrites the digests, in the
same commit, with:

    python tests/golden.py --write
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import polars as pl

GOLDEN = Path(__file__).resolve().parent / "fixtures" / "golden" / "digests.json"
SKIPPED = {"timing.json"}

# name -> the CLI arguments that write it (a demo writes two runs: <name>/before and <name>/after).
RUNS: dict[str, list[str]] = {
    "azure-conv-2023": ["run", "azure-conv-2023"],
    "azure-code-2023": ["run", "azure-code-2023"],
    "mooncake-synthetic": ["run", "mooncake-synthetic"],
    "incident": ["demo", "incident"],
}


def _column_digest(h: "hashlib._Hash", series: pl.Series) -> None:
    h.update(f"{series.name}\0{series.dtype}\0{series.len()}\0".encode())
    h.update(series.is_null().to_numpy().tobytes())
    if series.dtype == pl.String or series.dtype == pl.Categorical or series.dtype == pl.Enum:
        h.update("\0".join(series.cast(pl.String).fill_null("").to_list()).encode())
    elif series.dtype.is_nested():
        h.update(json.dumps(series.to_list(), sort_keys=True, default=str).encode())
    else:
        values = series.to_physical().fill_null(0).to_numpy()
        h.update(np.ascontiguousarray(values).astype(values.dtype.newbyteorder("<")).tobytes())


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    if path.suffix == ".parquet":
        frame = pl.read_parquet(path)
        for name in frame.columns:
            _column_digest(h, frame[name])
    elif path.suffix == ".json":
        h.update(json.dumps(json.loads(path.read_text()), sort_keys=True).encode())
    else:
        h.update(path.read_bytes())
    return h.hexdigest()


def run_digests(run_dir: Path) -> dict[str, str]:
    """{relative file path: content digest} of every file of one run directory."""
    return {str(p.relative_to(run_dir)): file_digest(p)
            for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name not in SKIPPED}


def replay(name: str, out: Path) -> dict[str, str]:
    """Write run `name` under `out` with the CLI and return the digests of its files."""
    from llm_replay.app import main

    target = out / name
    code = main([*RUNS[name], "--out", str(target)])
    if code != 0:
        raise RuntimeError(f"llm-replay {' '.join(RUNS[name])} exited {code}")
    return run_digests(target)


def load() -> dict[str, dict[str, str]]:
    return json.loads(GOLDEN.read_text())


def write() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        digests = {name: replay(name, Path(tmp)) for name in RUNS}
    GOLDEN.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN} ({sum(map(len, digests.values()))} files of {len(digests)} runs)")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    write()
