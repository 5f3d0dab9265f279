"""One numba dispatch per policy family, built from the registry's ordered list of kernels.

A family's integer id is the position of its kernel in that list (policies/registry.py), so
no id is written anywhere by hand. `build_dispatch(kernels, unknown)` returns a jitted
`dispatch(id, *args)` that calls `kernels[id](*args)`, or returns `unknown` for an id with no
kernel, which the engine turns into an error status (never a fallback to a default policy).

How: a chain of links, `if id == i: return kernel_i(...)` else the next link, each compiled
with `forceinline=True` (LLVM inlines it, as the engine's other inner kernels; no Python or C
wrapper), so the engine kernel that calls the dispatch holds every policy's code inline, as its
hand-written if-chain did (a call that passes the engine's state as arguments costs hundreds of
scalar copies; see replay/engine/loop.py). numba cannot iterate a tuple of functions without its
experimental first-class function types, whose addresses cannot be cached, and cannot call a
closure with *args; so each link's source is written out for the family's number of arguments
and compiled here. A link is never cached itself: it is compiled into the engine kernel, and
that kernel is loaded from numba's cache by the next process (tests/unit/test_policy_dispatch.py
checks both).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

from numba import njit

_LINK = """
def link(pid, {args}):
    if {own} and pid == i:
        return kernel({args})
    if {after}:
        return rest(pid, {args})
    return unknown
"""


def build_dispatch(kernels: Sequence[Callable[..., Any]], unknown: Any,
                   gates: Sequence[str] | None = None) -> Callable[..., Any]:
    """`gates`: per kernel, the name of a flag (a bool global of the links, True here) under which
    its link is compiled; "True" for one every variant has. replay/engine/variants.py rebinds
    the flags per variant, and numba prunes a link whose flag is False, and the chain after a
    link when every later one's is, before typing them."""
    # getattr: with NUMBA_DISABLE_JIT=1 a kernel is its plain Python function.
    arities = {len(inspect.signature(getattr(k, "py_func", k)).parameters) for k in kernels}
    if len(arities) != 1:
        raise TypeError(f"a family's kernels must take the same arguments; got {sorted(arities)} of them")
    gates = list(gates or ["True"] * len(kernels))
    if len(gates) != len(kernels):
        raise TypeError(f"{len(gates)} gates for {len(kernels)} kernels")
    args = ", ".join(f"a{k}" for k in range(arities.pop()))
    flags = {gate: True for gate in gates if gate != "True"}
    dispatch = None
    for i in reversed(range(len(kernels))):  # id 0 is tested first
        after = " or ".join(dict.fromkeys(gates[i + 1:])) or "False"
        dispatch = _compile(_LINK.format(args=args, own=gates[i], after=after), "link", i=i, kernel=kernels[i],
                            rest=dispatch, unknown=unknown, **flags)
    return dispatch


def _compile(source: str, name: str, **names: Any) -> Callable[..., Any]:
    scope = dict(names)
    exec(compile(source, f"<policies._dispatch {name}>", "exec"), scope)  # noqa: S102 - our own template
    return njit(_nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)(scope[name])


def build_reference(twins: Sequence[Callable[..., Any]], family: str) -> Callable[..., Any]:
    """The reference engine's dispatch: the same ids, the plain-Python twins, and an error (not a
    default) for an id with no policy."""

    def dispatch(pid: int, *args: Any) -> Any:
        if not 0 <= pid < len(twins):
            raise UnknownPolicyId(f"{family} id {pid} has no policy in policies.registry "
                                  f"(known ids 0..{len(twins) - 1})")
        return twins[pid](*args)

    return dispatch


class UnknownPolicyId(RuntimeError):
    """An engine was given a policy id the registry does not have: a bug in the tool."""
