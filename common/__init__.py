"""What every layer may import: the bottom of `llm_replay -> tui -> replay -> policies -> traces
-> common` (pyproject.toml's import-linter contract).

- `errors`: `UserError` and its kinds, the one-line exit-2 mistakes;
- `configtools`: frozen config dataclasses from YAML dicts, with key paths in every error;
- `bounds`: every numeric config key's sane range;
- `yamlfile`: the bounded, duplicate-key-refusing YAML reader for user files;
- `files`: opening user files safely (regular files only, sizes bounded).

Only helpers that know nothing of traces, engines, policies or dashboards belong here: this package
imports nothing of the project outside itself.
"""
