"""Calling a user's numba policy from the engine kernel through its native address.

The engine is compiled and cached once; a user's policy is compiled (and cached) on its own.
The engine receives each pool's policy as an int64 address and calls it with an intrinsic that
casts the address to the function numba compiled for the family's signature and makes the
call in numba's own calling convention, so an exception the policy raises propagates out of
the engine as it would from any numba function. Measured on this tool's machines
(/work/research-fcf, issue 12): a few ns per call over an inlined policy, about 0.6 us per
engine entry; numba's first-class function types cost 53-74 us per entry instead (unboxed
on every call into the kernel), a dispatcher argument recompiles the engine in every
process, and `cfunc` swallows exceptions (it prints them and returns 0).

The address is only valid while its dispatcher lives: the UserPolicy that holds it is kept by
the run's config. Addresses are never stored across processes. This uses numba internals
(`call_conv`, the compile result's library and `fndesc`); tests/unit/test_user_policies.py
runs a raising and a wrongly-typed policy so that a numba upgrade that breaks them fails there.
"""

from __future__ import annotations

from typing import Any

from numba import types
from numba.core import cgutils
from numba.core.dispatcher import Dispatcher
from numba.extending import intrinsic

from policies.user import ADMISSION_SIG, FAMILIES, QUEUE_SIG, ROUTER_SIG, VICTIM_SIG, UserPolicy


def _matches(given: Any, declared: Any) -> bool:
    """A value of type `given` may be passed where `declared` is expected: the same type, or an
    array that differs only by being writable where the policy sees it read-only (both have
    the same data model, so the call passes it unchanged)."""
    if isinstance(given, types.Array) and isinstance(declared, types.Array):
        return (given.dtype == declared.dtype and given.ndim == declared.ndim and given.layout == declared.layout
                and (given.mutable or not declared.mutable))
    return given == declared


def _check(sig: Any, given: tuple[Any, ...]) -> None:
    if len(given) != len(sig.args) or not all(_matches(g, d) for g, d in zip(given, sig.args)):
        raise TypeError(f"a user policy's arguments {given} do not match its signature {sig}")


def _codegen(sig: Any):
    def codegen(context, builder, signature, llargs):
        fnty = context.call_conv.get_function_type(sig.return_type, sig.args)
        fn = builder.inttoptr(llargs[0], fnty.as_pointer())
        status, result = context.call_conv.call_function(builder, fn, sig.return_type, sig.args, list(llargs[1:]))
        with cgutils.if_unlikely(builder, status.is_error):
            context.call_conv.return_status_propagate(builder, status)  # the policy raised: so does the engine
        return result
    return codegen


def _caller4(sig: Any):
    @intrinsic
    def call(typingctx, addr, a0, a1, a2, a3):
        _check(sig, (a0, a1, a2, a3))
        return sig.return_type(addr, a0, a1, a2, a3), _codegen(sig)
    return call


def _caller3(sig: Any):
    @intrinsic
    def call(typingctx, addr, a0, a1, a2):
        _check(sig, (a0, a1, a2))
        return sig.return_type(addr, a0, a1, a2), _codegen(sig)
    return call


call_router = _caller4(ROUTER_SIG)
call_queue_key = _caller3(QUEUE_SIG)
call_victim = _caller4(VICTIM_SIG)
call_admission = _caller4(ADMISSION_SIG)


def compile_policy(policy: UserPolicy) -> int:
    """Compile (or load from numba's cache) the policy's kernel for its family's signature and
    return its native address. ValueError says what is wrong: not a numba function, a cfunc, a
    signature that does not compile or returns the wrong type."""
    sig = FAMILIES[policy.family][0]
    kernel = policy.kernel
    if not isinstance(kernel, Dispatcher):
        what = "a numba cfunc (its exceptions are lost)" if hasattr(kernel, "address") else type(kernel).__name__
        raise ValueError(f"its kernel is {what}, expected an @njit function")
    declared = kernel.overloads.get(sig.args)
    if declared is not None and declared.signature.return_type != sig.return_type:
        raise ValueError(f"its kernel returns {declared.signature.return_type}, expected {sig.return_type}")
    try:
        cres = kernel.get_compile_result(sig)
    except Exception as exc:  # noqa: BLE001 - numba's TypingError / TypeError, said in one line
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise ValueError(f"its kernel does not compile for the {policy.family} signature {sig}: {first}") from None
    if cres.signature.return_type != sig.return_type:
        raise ValueError(f"its kernel returns {cres.signature.return_type}, expected {sig.return_type}")
    return int(cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name))
