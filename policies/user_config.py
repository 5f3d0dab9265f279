"""A config's user policy: a `"module:function"` (or an installed entry point) resolved, checked and
compiled, and the per-pool table the engines read (`UserTable`).

Checked when the config is read, before anything runs: the name must be a policies.user
policy of the config key's family, with a reference twin that takes the family's arguments,
a kernel that compiles for the family's signature and returns its type, and parameters the
policy declares. Each is one ConfigError naming the key, the policy and what was expected.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from policies._native import compile_policy
from policies._userview import FAMILY_OF
from policies.plugins import ENTRY_POINT_GROUP, user_object
from policies.user import FAMILIES, MAX_PARAMS, MAX_STATE, UserPolicy
from common.errors import UserError

_DECORATOR = {"router": "router", "queue order": "queue_order", "preemption victim": "victim",
              "admission": "admission"}


@dataclass(frozen=True)
class UserChoice:
    """A pool's user policy and the parameter values its config chose (declared order)."""

    policy: UserPolicy
    values: tuple[float, ...]

    def row(self) -> tuple[float, ...]:
        """The engines' router-parameter row of a user router: whether it reads prefix hits."""
        return (float(self.policy.reads_prefix),)

    def columns(self) -> dict[str, int]:
        """A user admission rule sets none of the built-in rules' admission columns."""
        return {}


def is_user_name(name: Any) -> bool:
    return isinstance(name, str) and ":" in name


def user_policy(name: str, family: str, params: Mapping[str, Any] | None = None) -> UserChoice | None:
    """The user policy `name` names for `family` with `params`, checked and compiled; None when
    `name` is neither a "module:function" nor an installed entry point. ValueError (or a
    ConfigError from the plugin lookup) says what is wrong, for the config loader to prefix
    with the key."""
    try:
        obj = user_object(name, family, "")
    except UserError as exc:
        raise ValueError(str(exc)) from None
    if obj is None:
        return None
    policy = _checked(name, family, obj)
    return UserChoice(policy, _values(name, policy, params or {}))


def _checked(name: str, family: str, obj: Any) -> UserPolicy:
    decorator = f"policies.user.{_DECORATOR[family]}(reference=...)"
    if not isinstance(obj, UserPolicy):
        if hasattr(obj, "py_func"):
            raise ValueError(f"{family} {name!r} is a numba function with no reference twin; wrap it with "
                             f"{decorator}")
        raise ValueError(f"{family} {name!r} is {type(obj).__name__}, expected a {family} made with {decorator}")
    if obj.family != family:
        raise ValueError(f"{family} {name!r} is a {obj.family} policy, expected a {family}")
    argnames = FAMILIES[family][1]
    if not callable(obj.reference):
        raise ValueError(f"{family} {name!r}: its reference twin is {type(obj.reference).__name__}, expected a "
                         f"function ({', '.join(argnames)})")
    try:
        inspect.signature(obj.reference).bind(*argnames)
    except TypeError:
        raise ValueError(f"{family} {name!r}: its reference twin takes ({_params(obj.reference)}), expected "
                         f"({', '.join(argnames)})") from None
    except ValueError:  # a builtin without a signature: let the call decide
        pass
    if not (isinstance(obj.state, int) and 0 <= obj.state <= MAX_STATE):
        raise ValueError(f"{family} {name!r}: state={obj.state!r}, expected int64 entries per pool from 0 to "
                         f"{MAX_STATE}")
    if len(obj.params) > MAX_PARAMS or not all(isinstance(k, str) and _number(v) for k, v in obj.params.items()):
        raise ValueError(f"{family} {name!r}: params={obj.params!r}, expected at most {MAX_PARAMS} names with "
                         "float defaults")
    try:
        compile_policy(obj)
    except ValueError as exc:
        raise ValueError(f"{family} {name!r}: {exc}") from None
    return dataclasses.replace(obj, name=name)


def _params(fn: Any) -> str:
    try:
        return ", ".join(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return "?"


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _values(name: str, policy: UserPolicy, params: Mapping[str, Any]) -> tuple[float, ...]:
    for key, value in params.items():
        if key not in policy.params:
            known = ", ".join(policy.params) or "none"
            raise ValueError(f"{policy.family} {name!r} has no parameter {key!r}; its parameters: {known}")
        if not _number(value):
            raise ValueError(f"{policy.family} {name!r}: {key}: got {value!r}, expected a finite number")
    return tuple(float(params.get(k, default)) for k, default in policy.params.items())


def not_found(known: Sequence[str]) -> str:
    """The tail of an unknown-policy message: the built-ins and how to name a user's policy."""
    return (f"known: {', '.join(known)}, or 'module:function' of a --plugin module, or a plugin's "
            f"{ENTRY_POINT_GROUP} entry point")


@dataclass(frozen=True)
class UserTable:
    """Per family and pool, the user policy the engines call (None: a built-in), and the config
    key each came from, for the errors that name it."""

    choices: Mapping[str, tuple[UserChoice | None, ...]]
    keys: Mapping[str, tuple[str, ...]]

    @property
    def pools(self) -> int:
        return len(next(iter(self.choices.values()), ()))

    def any(self) -> bool:
        return any(c is not None for row in self.choices.values() for c in row)

    def policies(self, family: str) -> list[UserPolicy | None]:
        return [None if c is None else c.policy for c in self.choices.get(family, ())] or [None] * self.pools

    def addresses(self, family: str) -> np.ndarray:
        return np.array([0 if p is None else compile_policy(p) for p in self.policies(family)], np.int64)

    def params(self, family: str) -> np.ndarray:
        rows = [() if c is None else c.values for c in self.choices.get(family, ())] or [()] * self.pools
        out = np.zeros((max(1, len(rows)), max([1, *map(len, rows)])), np.float64)
        for p, row in enumerate(rows):
            out[p, :len(row)] = row
        return out

    def state(self, family: str) -> np.ndarray:
        sizes = [p.state for p in self.policies(family) if p is not None]
        return np.zeros((max(1, self.pools), max([1, *sizes])), np.int64)

    def reads_prefix(self, family: str, pool: int) -> bool:
        policy = self.policies(family)[pool]
        return bool(policy is not None and policy.reads_prefix)

    def error(self, family_code: int, pool: int, message: str) -> UserError:
        family = FAMILY_OF.get(family_code, "policy")
        policy = self.policies(family)[pool] if 0 <= pool < self.pools else None
        name = policy.name if policy is not None else "?"
        key = self.keys.get(family, ())[pool] if 0 <= pool < len(self.keys.get(family, ())) else family
        return UserError(f"{key}: the {family} {name!r} {message}")

