"""Build frozen dataclasses from YAML-loaded dicts, rejecting unknown keys with the known ones.

Every config section of the tool goes through `from_dict`, so every error names its key path
(`pools[0].engine.max_num_seqs`) the same way.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import reprlib
import types
import typing
from typing import Any, TypeVar

from common.bounds import out_of_bounds
from common.errors import ConfigError

T = TypeVar("T")


def from_dict(cls: type[T], data: Any, path: str, source: str = "config") -> T:
    """Construct dataclass `cls` from `data`; `path` names the section in error messages."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: {path or 'top level'}: expected a mapping, got {_show(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted((str(k) for k in data if k not in fields))
    if unknown:
        where = f"{path}.{unknown[0]}" if path else unknown[0]
        raise ConfigError(f"{source}: unknown key {where!r}{suggest(unknown[0], fields)}; known keys: "
                          f"{', '.join(sorted(fields))}")
    missing = [
        name for name, f in fields.items()
        if name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        where = f"{path}.{missing[0]}" if path else missing[0]
        raise ConfigError(f"{source}: missing key {where!r} (required)")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = coerce(hints[name], value, f"{path}.{name}" if path else name, source)
    try:
        built = cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        # A message that starts with one of the section's field names is about that key.
        text = str(exc)
        field, sep, rest = text.partition(":")
        if sep and field.split(".")[0] in fields:  # "router.scorers: ..." is under field `router`
            where = f"{path}.{field}" if path else field
            raise ConfigError(f"{source}: {where}:{rest}") from None
        raise ConfigError(f"{source}: {path or 'top level'}: {text}") from None
    # The section's own checks say what a value means; past them, no number may be absurd
    # (common/bounds.py): 1e300 seconds passes "> 0" but no clock or array can hold it.
    for name, value in kwargs.items():
        problem = out_of_bounds(cls, name, value)
        if problem is not None:
            raise _expected(f"{path}.{name}" if path else name, value, problem, source)
    return built


def coerce(hint: Any, value: Any, path: str, source: str) -> Any:
    """Check `value` against the type `hint`, converting ints to floats and lists to tuples."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(arg, value, path, source)
            except ConfigError as exc:
                errors.append(exc)
        # A value of none of the kinds: name them all ("a string or a mapping"); one that is of a
        # kind but wrong inside: that error, which names the inner key.
        deeper = [e for e in errors if getattr(e, "expected_at", None) != path]
        if deeper:
            raise deeper[-1]
        kinds = [e.expected for e in errors] + (["null"] if type(None) in args else [])
        raise _expected(path, value, " or ".join(dict.fromkeys(kinds)), source)
    if hint is Any:
        return value
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, path, source)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise _expected(path, value, "a list", source)
        inner = args[0] if args else Any
        return tuple(coerce(inner, v, f"{path}[{i}]", source) for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise _expected(path, value, "a mapping", source)
        vt = args[1] if len(args) == 2 else Any
        return {str(k): coerce(vt, v, f"{path}.{k}", source) for k, v in value.items()}
    if origin is typing.Literal:
        if value not in args:
            raise _expected(path, value, "one of " + ", ".join(repr(a) for a in args), source)
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise _expected(path, value, "true or false", source)
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _expected(path, value, "an integer", source)
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise _expected(path, value, "a finite number", source)
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise _expected(path, value, "a string", source)
        return value
    return value


def suggest(name: Any, known: Any) -> str:
    """" (did you mean 'x'?)" when `name` is a likely typo of one of `known`, else ""."""
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _expected(path: str, value: Any, what: str, source: str) -> ConfigError:
    error = ConfigError(f"{source}: {path}: got {_show(value)}, expected {what}")
    error.expected_at, error.expected = path, what  # what a union's message combines
    return error


# repr() of a large value costs as much as the value; reprlib stops after a few items and levels.
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 3, 8, 8, 6, 70, 70


def _show(value: Any) -> str:
    text = _REPR.repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
