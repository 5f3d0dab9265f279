"""The one YAML reader for user files (fleet configs, scenarios, step-model profiles).

`yaml.safe_load` is not enough for files a user may have been handed: it keeps duplicate keys
silently, reads 2e9 as a string (YAML 1.1), and builds whatever an anchor expands to. A 361-byte
"billion laughs" file (nine levels of aliases, each listing the previous one nine times) is
only a few nodes as composed, yet a billion once anything walks it (an error message's repr, a
deep copy), and 5,000 nested brackets overflow Python's stack. So the loader bounds nesting as
it composes and the expanded size (each alias counts its whole subtree again) before anything is
constructed; either limit is one ConfigError naming the file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from common.errors import ConfigError

# Far above any real config (the shipped scenarios are about 2,000 nodes and 8 levels deep),
# far below what hurts: 200,000 Python objects are a few tens of MB.
MAX_NODES = 200_000
MAX_DEPTH = 64
MAX_BYTES = 16 * 1024 * 1024


class _LimitError(yaml.YAMLError):
    def __init__(self, problem: str, mark: Any = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = mark


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader with duplicate keys refused, YAML 1.2 floats, and the bounds above."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):  # noqa: ANN001 - PyYAML's signature
        # PyYAML composes recursively (about three frames a level); stop long before the stack does.
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _LimitError(f"nested more than {MAX_DEPTH} levels deep (values, lists and mappings)", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node):  # noqa: ANN001
        expanded_size(node)
        return super().construct_document(node)


def expanded_size(root: yaml.Node) -> int:
    """Nodes in the document once every alias is replaced by what it names; over MAX_NODES or
    recursive (an anchor used inside itself) is a _LimitError. Memoized per node, so a billion
    laughs is measured in a few steps instead of a billion."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        kids = _children(node)
        if children_done:
            open_nodes.discard(key)
            size = 1 + sum(sizes[id(k)] for k in kids)
            if size > MAX_NODES:
                raise _LimitError(f"expands to more than {MAX_NODES:,} values (aliases repeat what their "
                                  "anchor names; is an alias nested in another?)", node.start_mark)
            sizes[key] = size
            continue
        if key in open_nodes:
            raise _LimitError("an alias is used inside its own anchor (a recursive value)", node.start_mark)
        open_nodes.add(key)
        stack.append((node, True))
        for kid in kids:
            if id(kid) in open_nodes:
                raise _LimitError("an alias is used inside its own anchor (a recursive value)", kid.start_mark)
            stack.append((kid, False))
    return sizes[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _construct_mapping(loader: _BoundedLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:  # an unhashable key; construct_mapping says so with its line
            break
        if duplicate:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {_short(key)}", key_node.start_mark)
    return loader.construct_mapping(node, deep=deep)


_BoundedLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
# PyYAML follows YAML 1.1, where 2e9 and 4.0e9 are strings; read them as numbers, as YAML 1.2 does.
_BoundedLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, (list, dict, tuple, set)) else f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


def load_yaml_text(text: str, source: str) -> Any:
    """`text` through the bounded loader; every problem is one ConfigError starting with `source`."""
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.constructor.ConstructorError as exc:
        line = _line(exc)
        if exc.problem.startswith("duplicate key"):
            raise ConfigError(f"{source}{line}: {exc.problem} (each key may appear once)") from None
        raise ConfigError(f"{source}{line}: {exc.problem} (only plain YAML values are allowed)") from None
    except _LimitError as exc:
        raise ConfigError(f"{source}{_line(exc)}: {exc.problem}; refused before building it") from None
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}{_line(exc)}: not valid YAML: {problem}") from None


def _line(exc: Exception) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f" line {mark.line + 1}" if mark else ""


def read_yaml(path: str | Path, what: str = "config") -> Any:
    """A YAML file through the bounded loader (YAML 1.2 floats, no duplicate keys, no Python
    tags, bounded size and depth); every problem is one ConfigError naming the file (and line),
    as `what` file. Opened as common/files.py opens every input: a regular file or nothing."""
    from common.files import read_text_file

    raw = read_text_file(path, str(path), what, MAX_BYTES, ConfigError)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (expected YAML)") from None
    return load_yaml_text(text, str(path))
