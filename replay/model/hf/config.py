"""A model from a Hugging Face `config.json`, read offline: `model: path/to/config.json` (or its folder).

The file is bounded (a regular file of at most 1 MiB, JSON nested at most 32 deep, no duplicate
keys, no NaN); its `architectures[0]` picks the counting code of replay/model/hf/arch.py, and its
`quantization_config` the weight format (names of replay.model.specs.WEIGHT_DTYPE_BITS). Every problem is
one ConfigError naming the file, the key and what was expected.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

from common.errors import ConfigError
from replay.model.models import ModelSpec, spec_from_config

MAX_BYTES = 1 << 20
MAX_DEPTH = 32

def looks_like_path(value: object) -> bool:
    """Catalog ids hold no slash and no `.json`; a `model:` value that does is a path."""
    return isinstance(value, str) and ("/" in value or "\\" in value or value.endswith(".json")
                                       or value in (".", ".."))


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if depth <= MAX_DEPTH:
                stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def read_config(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """(the config.json's path, its parsed object); a folder means the config.json inside it."""
    path = Path(path).expanduser()
    if path.is_dir():
        path = path / "config.json"
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ConfigError(f"{path}: model config not found (expected a catalog id, or a Hugging Face "
                          "config.json or the folder holding one)") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read model config: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{path}: expected a regular file (a Hugging Face config.json)")
    if info.st_size > MAX_BYTES:
        raise ConfigError(f"{path}: {info.st_size:,} bytes, expected a config.json of at most {MAX_BYTES:,}")
    try:
        with path.open("rb") as fh:
            text = fh.read(MAX_BYTES + 1).decode("utf-8")
        data = json.loads(text, object_pairs_hook=_reject_duplicates, parse_constant=_no_constant)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read model config: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (expected a JSON config.json)") from None
    except RecursionError:
        raise ConfigError(f"{path}: JSON nested too deep (expected at most {MAX_DEPTH} levels)") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: line {exc.lineno}: not valid JSON: {exc.msg}") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object (a Hugging Face config.json), got {type(data).__name__}")
    if _depth(data) > MAX_DEPTH:
        raise ConfigError(f"{path}: JSON nested too deep (expected at most {MAX_DEPTH} levels)")
    return path, data


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")




_CACHE: dict[tuple[str, int, int], ModelSpec] = {}


def load_model(path: str | Path) -> ModelSpec:
    """The ModelSpec of a config.json (or its folder); its id is the file's path, so messages name it.
    Parsed once per file version (path, size, mtime): plan_pools and the step model both ask."""
    path, data = read_config(path)
    info = path.stat()
    key = (str(path.resolve()), info.st_size, info.st_mtime_ns)
    if key not in _CACHE:
        name = data.get("_name_or_path") if isinstance(data.get("_name_or_path"), str) else ""
        folder = path.resolve().parent.name
        _CACHE[key] = spec_from_config(str(path), name or folder, name or folder, data, str(path))
    return _CACHE[key]
