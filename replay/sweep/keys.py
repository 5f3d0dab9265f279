"""Dotted config keys of a sweep (`pools.0.replicas`, `trace.rate_scale`): checked against the
fleet config's schema (the dataclasses of replay/config.py) before anything runs, and set in a
config mapping per cell.

A key walks the schema one part at a time: a section's field name, a list's index (or `*`: every
element), and below a free-form mapping (a router's or an autoscaler's `params`) any name, which
the cell's build then checks as `run --config` would. A first part that is a pool key and not a
fleet key (`router`, `engine.max_num_seqs`, `autoscaler.max_replicas`) is shorthand for every
pool: `pools.*.router`.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any

from common.errors import ConfigError
from replay.config import FleetConfig, PoolConfig

EVERY = "*"


def canonical(key: str) -> str:
    """The key as a full path from the fleet config's top (pool shorthand expanded)."""
    first = key.split(".")[0]
    fleet = {f.name for f in dataclasses.fields(FleetConfig)}
    pool = {f.name for f in dataclasses.fields(PoolConfig)}
    if first not in fleet and first in pool:
        return f"pools.{EVERY}.{key}"
    return key


def check_key(key: str, base: dict, source: str) -> str:
    """`key` in canonical form, or a ConfigError naming `source`, the key and the nearest known
    keys. `base`: the base config mapping (a list index must name one of its elements)."""
    pools = len(base.get("pools") or ()) or 1
    if not isinstance(key, str) or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"{source}: key {key!r}: expected a dotted config key such as pools.0.replicas")
    full = canonical(key)
    hint: Any = FleetConfig
    walked: list[str] = []
    for part in full.split("."):
        hint = _section(hint)
        if hint is Any:  # a free-form mapping: its keys are the policy's, checked when a cell is built
            break
        if _is_list(hint):
            where = ".".join(walked)
            size = len(_lookup(base, walked) or ())
            if part != EVERY and not (part.isdigit() and int(part) < size):
                has = f"index 0 to {size - 1}" if size else "no index"
                raise ConfigError(f"{source}: key {key!r}: {where}.{part}: expected an {has} (the base config's "
                                  f"{where} has {size} entr{'y' if size == 1 else 'ies'}) or {EVERY}")
            hint = typing.get_args(hint)[0]
        elif dataclasses.is_dataclass(hint):
            names = {f.name: f for f in dataclasses.fields(hint) if f.init}
            if part not in names:
                raise ConfigError(f"{source}: key {key!r}: not a config key; nearest known keys: "
                                  f"{', '.join(nearest(key, pools))}")
            hint = typing.get_type_hints(hint)[part]
        else:
            where = ".".join(walked)
            raise ConfigError(f"{source}: key {key!r}: {where} is a value, not a section; nearest known keys: "
                              f"{', '.join(nearest(key, pools))}")
        walked.append(part)
    return full


def _lookup(data: Any, parts: list[str]) -> Any:
    for part in parts:
        if isinstance(data, list):
            data = data[int(part)] if part.isdigit() and int(part) < len(data) else None
        elif isinstance(data, dict):
            data = data.get(part)
        else:
            return None
    return data


def _section(hint: Any) -> Any:
    """What a key may descend into below `hint`: a dataclass, a list, Any (free-form), or a scalar."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        for arg in args:  # a section of its own first (autoscaler: AutoscalerConfig | None)
            if dataclasses.is_dataclass(arg):
                return arg
        for arg in args:  # then a mapping (router: str | dict)
            if typing.get_origin(arg) is dict:
                return Any
        return args[0] if len(args) == 1 else hint
    if origin is dict:
        return Any
    return hint


def _is_list(hint: Any) -> bool:
    return typing.get_origin(hint) is tuple and dataclasses.is_dataclass(typing.get_args(hint)[0])


def known_keys(pools: int) -> list[str]:
    """Every dotted key of the schema down to the values (lists as `pools.N` for each base pool)."""
    out: list[str] = []

    def walk(hint: Any, prefix: str, depth: int) -> None:
        hint = _section(hint)
        if depth > 6 or hint is Any or not (dataclasses.is_dataclass(hint) or _is_list(hint)):
            if prefix:
                out.append(prefix)
            return
        if _is_list(hint):
            for i in range(max(pools, 1)):
                walk(typing.get_args(hint)[0], f"{prefix}.{i}", depth + 1)
            return
        for name, inner in typing.get_type_hints(hint).items():
            walk(inner, f"{prefix}.{name}" if prefix else name, depth + 1)

    walk(FleetConfig, "", 0)
    return out


def nearest(key: str, pools: int, most: int = 5) -> list[str]:
    known = known_keys(pools)
    close = difflib.get_close_matches(canonical(key).replace(EVERY, "0"), known, n=most, cutoff=0.6)
    if not close:  # nothing alike: the keys of the deepest section the key did reach
        parts = canonical(key).replace(EVERY, "0").split(".")
        for cut in range(len(parts) - 1, -1, -1):
            prefix = ".".join(parts[:cut])
            close = [k for k in known if k.startswith(prefix + ".") or not prefix][:most]
            if close:
                break
    return close


def set_key(data: dict, key: str, value: Any, source: str) -> None:
    """Set canonical `key` to `value` in the config mapping `data` (sections made as needed)."""
    parts = key.split(".")
    _set(data, parts, value, key, source)


def _set(node: Any, parts: list[str], value: Any, key: str, source: str) -> None:
    part, rest = parts[0], parts[1:]
    if isinstance(node, list):
        targets = range(len(node)) if part == EVERY else [int(part)]
        for i in targets:
            if not rest:
                node[i] = value
            else:
                node[i] = _descend(node[i], rest, value, key, source)
        return
    if not rest:
        node[part] = value
        return
    node[part] = _descend(node.get(part), rest, value, key, source)


def _descend(child: Any, rest: list[str], value: Any, key: str, source: str) -> Any:
    if child is None:
        child = {}
    if not isinstance(child, (dict, list)):
        raise ConfigError(f"{source}: key {key!r}: the base config's value above {rest[0]!r} is {child!r}, "
                          "not a section to set a key in")
    _set(child, rest, value, key, source)
    return child
