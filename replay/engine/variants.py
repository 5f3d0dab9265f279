"""Kernel variants: a replay compiles only the features it uses.

Every run used to type and lower prefill/decode transfers, multi-LoRA, speculative decoding,
closed-loop sessions, users' policies and every built-in policy, whether it used them or not. Each
of these is behind a flag here, read by the kernels as a bare global at its call sites
(`if WITH_PD and ...`). numba freezes a global into the kernel and prunes a branch on a constant
before typing (`numba.core.analysis.dead_branch_prune`), so code behind a False flag is never
typed, lowered or optimised.

The module's values (all True) are the *full* variant: the kernels as written. Another variant
is built by `specialise`: a kernel that reads a flag, or calls (transitively) one that does, is
recompiled from the same code object with that variant's flag values in a copy of its globals,
and its callees swapped for their own copies; a kernel that reaches no flag is shared by every
variant. A copy has its own name (`advance_nb__plain`), so numba caches it beside the original in
the same cache, keyed as every kernel is (replay/_numba_cache.py); the dispatch links are not
cached, as their originals (policies/_dispatch.py).

Two variants, not one per combination of features: each costs a cold compile, and a test suite
or a sweep that mixes features would compile dozens. `plain` is what the README's Quick start
runs: vLLM's defaults (each family's default policy; no P/D, LoRA, speculation, sessions or
user policies), on any number of pools; a run that uses anything more runs `full`.
`variant_of(features)` picks the first that covers a run.
"""

from __future__ import annotations

import contextlib
import dis
import types as pytypes
from collections.abc import Iterator
from typing import Any, NamedTuple

# The flags, as the kernels read them. True here: the full variant.
WITH_PD = True  # prefill/decode disaggregation: KV transfers between pools (engine/transfer.py)
WITH_LORA = True  # multi-LoRA adapter slots (engine/lora.py)
WITH_SPEC = True  # speculative decoding's verify steps and token credits
WITH_SESSIONS = True  # closed-loop sessions' release heap (engine/sessions.py)
WITH_USER = True  # users' own per-step policies (policies/user.py)
# the built-in policies other than each family's default (id 0), and what only they read: the
# routers' scraped view and prefix-cache hits, the pool's queue totals (admission)
WITH_POLICIES = True


class Features(NamedTuple):
    """What a replay uses, one field per flag (the flag is `WITH_` + the field's name, upper)."""

    pd: bool = False
    lora: bool = False
    spec: bool = False
    sessions: bool = False
    user: bool = False
    policies: bool = False


# In the order they are tried: a run gets the first that has every feature it uses.
VARIANTS: dict[str, Features] = {
    "plain": Features(),
    "full": Features(*(True,) * len(Features._fields)),
}
FULL = "full"
FLAGS = tuple(f"WITH_{name.upper()}" for name in Features._fields)


def features(inputs: Any) -> Features:
    """What a replay of these EngineInputs (replay/engine/common.py) uses."""
    import numpy as np

    from replay.engine.common import SPEC_CREDIT_SCALE

    ids = [inputs.pool_router] + [inputs.policy_ids(family) for family in ("queue", "victim", "admission")]
    return Features(
        pd=inputs.pd_prefill_pool >= 0,
        lora=bool(np.any(inputs.per_pool("lora_slots", 0) > 0)),
        # a verify step, or a decode step whose tokens are not exactly one (credit column 0)
        spec=bool(np.any(inputs.per_pool("spec_k", 0) > 0) or np.any(inputs.spec_credits[:, 0] != SPEC_CREDIT_SCALE)),
        sessions=inputs.closed_loop,
        user=inputs.user is not None,
        policies=any(bool(np.any(np.asarray(column) != 0)) for column in ids),
    )


_LEAST = ["plain"]  # `at_least`'s floor


def variant_of(features: Features) -> str:
    """The first variant that has every feature the run uses (and is not before `at_least`'s)."""
    names = list(VARIANTS)
    for name in names[names.index(_LEAST[-1]):]:
        if all(has or not used for has, used in zip(VARIANTS[name], features)):
            return name
    raise AssertionError("the full variant has every feature")


@contextlib.contextmanager
def at_least(variant: str) -> Iterator[None]:
    """Engines made inside run `variant` or a later one: the warm-up compiles a run's variant on
    a tiny trace that would run the plain one (replay/run.py)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown kernel variant {variant!r}; known: {', '.join(VARIANTS)}")
    _LEAST.append(variant)
    try:
        yield
    finally:
        _LEAST.pop()


def policy_gates(modules: tuple[Any, ...]) -> list[str]:
    """The flags of a policy family's dispatch links (policies/_dispatch.py), in id order: the
    family's default (id 0) in every variant, a user's policy (its `user` module) under WITH_USER,
    the other built-ins under WITH_POLICIES."""
    return ["True" if i == 0 else "WITH_USER" if m.__name__.rsplit(".", 1)[-1] == "user" else "WITH_POLICIES"
            for i, m in enumerate(modules)]


_COPIES: dict[str, dict[int, Any]] = {}  # per variant: id(original kernel) -> its copy (or itself)


def specialise(kernel: Any, variant: str) -> Any:
    """The kernel as compiled in `variant`: itself in the full variant, or when it reaches no flag
    (nor with NUMBA_DISABLE_JIT, where a kernel is its Python function: every flag is True)."""
    if variant == FULL or not hasattr(kernel, "py_func"):
        return kernel
    flags = dict(zip(FLAGS, VARIANTS[variant]))
    return _copy(kernel, variant, flags, _COPIES.setdefault(variant, {}))


def _copy(kernel: Any, variant: str, flags: dict[str, bool], copies: dict[int, Any]) -> Any:
    if id(kernel) in copies:
        return copies[id(kernel)]
    from numba import njit
    from numba.core.caching import NullCache
    from numba.core.dispatcher import Dispatcher

    py = kernel.py_func
    copies[id(kernel)] = kernel  # while its callees are copied (kernels do not recurse)
    swapped = {}
    for name in _global_names(py.__code__):
        value = py.__globals__.get(name)
        if name in flags and isinstance(value, bool):
            if value != flags[name]:
                swapped[name] = flags[name]
        elif isinstance(value, Dispatcher):
            copy = _copy(value, variant, flags, copies)
            if copy is not value:
                swapped[name] = copy
    if not swapped:
        return kernel
    func = pytypes.FunctionType(py.__code__, {**py.__globals__, **swapped}, py.__name__, py.__defaults__,
                                py.__closure__)
    func.__qualname__ = f"{py.__qualname__}__{variant}"  # its own cache files
    func.__module__, func.__doc__ = py.__module__, py.__doc__
    options = {k: v for k, v in kernel.targetoptions.items() if k != "nopython"}
    copy = njit(cache=not isinstance(kernel._cache, NullCache), **options)(func)
    copies[id(kernel)] = copy
    return copy


def _global_names(code: pytypes.CodeType) -> set[str]:
    """Every name the code (and any code nested in it) loads as a global."""
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname == "LOAD_GLOBAL"}
    for const in code.co_consts:
        if isinstance(const, pytypes.CodeType):
            names |= _global_names(const)
    return names
