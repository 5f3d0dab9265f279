"""User code: only what the user named on the command line (`--plugin`) or installed as a plugin.

A config's `policy: "module:function"` names code; it never imports it. The command line's
`--plugin MODULE` (a module on sys.path, or a `.py` file) is the user's explicit choice to load a
module, and installed `llm_replay.policies` entry points are the user's explicit install. Before
anything is called its signature is checked against the documented one, so a function that
takes other arguments is a config error rather than a call with the wrong ones.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

from common.errors import ConfigError, UserError
from common.files import kind_of
from policies.user import UserPolicy

ENTRY_POINT_GROUP = "llm_replay.policies"

# The modules this command's --plugin flags allowed, by the name a config uses for them. A
# process-wide set rather than an argument because the lookups happen deep in planning and the
# control loop, long after the command line; load_plugins replaces it at every command's start.
_ALLOWED: dict[str, ModuleType] = {}

# What each kind of user function is called with (the README documents these).
SIGNATURES = {
    "autoscaler": ("ctx", "params", "state"),
    "pool split": ("trace", "pools"),
}


def load_plugins(specs: Sequence[str]) -> None:
    """Import each `--plugin` and allow configs to name it; replaces what an earlier command
    allowed (the CLI runs in-process in tests). A spec ending in `.py` is that file, known to
    configs by its stem; anything else is a module name imported from sys.path."""
    allowed: dict[str, ModuleType] = {}
    for spec in specs:
        name, module = _import(spec)
        allowed[name] = module
    _ALLOWED.clear()
    _ALLOWED.update(allowed)


def allowed_modules() -> dict[str, ModuleType]:
    return dict(_ALLOWED)


def _import(spec: str) -> tuple[str, ModuleType]:
    if not spec.strip():
        raise UserError("--plugin: empty; give a module name (mypkg.scalers) or a .py file")
    if spec.endswith(".py"):
        path = Path(spec)
        name = path.stem
        if not name.isidentifier():
            raise UserError(f"--plugin {spec}: the file's name {name!r} is not a Python identifier, so a config "
                            "could not name it as 'module:function'")
        if not path.is_file():
            what = kind_of(path.stat().st_mode) if path.exists() else None
            raise UserError(f"--plugin {spec}: " + (f"is {what}, expected a .py file" if what else "no such file"))
        loaded = sys.modules.get(name)
        if loaded is not None and getattr(loaded, "__file__", None) != str(path.resolve()):
            raise UserError(f"--plugin {spec}: a module named {name!r} is already loaded from elsewhere; rename "
                            "the file")
        loader_spec = importlib.util.spec_from_file_location(name, path.resolve())
        module = importlib.util.module_from_spec(loader_spec)
        # Registered before it runs, as importlib's recipe says: dataclasses and pickling inside
        # the module look themselves up in sys.modules.
        sys.modules[name] = module
        try:
            _run_module(spec, lambda: loader_spec.loader.exec_module(module))
        except UserError:
            sys.modules.pop(name, None)
            raise
        return name, module
    if not all(part.isidentifier() for part in spec.split(".")):
        raise UserError(f"--plugin {spec}: not a module name (mypkg.scalers) or a .py file")
    return spec, _run_module(spec, lambda: importlib.import_module(spec))


def _run_module(spec: str, load) -> Any:
    try:
        return load()
    except ModuleNotFoundError as exc:
        raise UserError(f"--plugin {spec}: no module named {exc.name!r} on the Python path") from None
    except Exception as exc:  # noqa: BLE001 - the user's module failed to import; say how, no traceback
        raise UserError(f"--plugin {spec}: importing it raised {type(exc).__name__}: {exc}") from None


def user_object(name: str, what: str, where: str) -> Any | None:
    """The object a `"module:attr"` policy names in an allowed module, or the installed
    `llm_replay.policies` entry point called `name`; None when `name` is neither. `where` prefixes
    errors ("FILE: KEY: ")."""
    if ":" in name:
        module_name, _, attr = name.partition(":")
        module = _ALLOWED.get(module_name)
        if module is None:
            raise ConfigError(f"{where}{name!r} names code in module {module_name!r}; pass --plugin {module_name} "
                              "to allow loading it")
        obj: Any = module
        for part in attr.split("."):
            if not part.isidentifier() or not hasattr(obj, part):
                raise ConfigError(f"{where}cannot load {what} {name!r}: module {module_name!r} has no {attr!r}")
            obj = getattr(obj, part)
        return obj
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            try:
                return ep.load()
            except Exception as exc:  # noqa: BLE001 - an installed plugin that fails to import
                raise ConfigError(f"{where}the installed plugin {name!r} ({ep.value}) failed to load: "
                                  f"{type(exc).__name__}: {exc}") from None
    return None


def is_entry_point(name: str) -> bool:
    return any(ep.name == name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def check_signature(obj: Any, name: str, what: str, where: str) -> None:
    """`obj` must be callable with the documented positional arguments of a `what`."""
    expected = SIGNATURES[what]
    if not callable(obj):
        raise ConfigError(f"{where}{what} {name!r} is not callable (a value of type {type(obj).__name__}); "
                          f"expected a function of ({', '.join(expected)})")
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}{what} {name!r}: its signature cannot be read; expected a Python function of "
                          f"({', '.join(expected)})") from None
    try:
        sig.bind(*expected)
    except TypeError:
        raise ConfigError(f"{where}{what} {name!r} takes {_bare(sig)}; expected a function of "
                          f"({', '.join(expected)})") from None


def _bare(sig: inspect.Signature) -> inspect.Signature:
    """The signature without annotations: the names and kinds are what do not match."""
    empty = inspect.Parameter.empty
    return sig.replace(parameters=[p.replace(annotation=empty) for p in sig.parameters.values()],
                       return_annotation=inspect.Signature.empty)


def fits(obj: Any, what: str) -> bool:
    try:
        check_signature(obj, "", what, "")
    except ConfigError:
        return False
    return True


def plugin_rows() -> list[dict[str, Any]]:
    """The functions of every --plugin module (defined there, public) that fit an autoscaler's or
    a pool split's signature, its per-step policies (policies.user), and the installed entry
    points (not loaded: listing runs no code)."""
    rows = []
    for module_name, module in _ALLOWED.items():
        items = sorted(vars(module).items())
        per_step = {attr: obj for attr, obj in items if isinstance(obj, UserPolicy)}
        twins = {id(obj.reference) for obj in per_step.values()}  # listed with their policy
        for attr, obj in items:
            if attr in per_step:
                rows.append({"family": f"{obj.family} (plugin)", "name": f"{module_name}:{attr}",
                             "params": dict(obj.params), "summary": obj.summary, "source": f"--plugin {module_name}"})
                continue
            if attr.startswith("_") or getattr(obj, "__module__", None) != module.__name__ or id(obj) in twins:
                continue
            for what in SIGNATURES:
                if fits(obj, what):
                    doc = (getattr(obj, "__doc__", None) or "").strip().splitlines()
                    rows.append({"family": f"{what} (plugin)", "name": f"{module_name}:{attr}", "params": {},
                                 "summary": doc[0] if doc else "(no docstring)", "source": f"--plugin {module_name}"})
                    break
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        rows.append({"family": "installed plugin", "name": ep.name, "params": {}, "summary": ep.value,
                     "source": f"entry point in {ENTRY_POINT_GROUP}"})
    return rows
