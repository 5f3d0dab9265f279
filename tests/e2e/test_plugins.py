"""Code named in a config runs only when the command line allowed it (issue 10, item 11)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

PLUGINS = Path(__file__).resolve().parents[1] / "fixtures" / "plugins"

FLEET = """
    model: llama-3.1-8b
    trace: {{window: {{end_s: 30}}}}
    split: {{policy: "{split}"}}
    pools: [{{name: short, replicas: 1}}, {{name: long, replicas: 1}}]
"""


@pytest.mark.parametrize(("policy", "module"), [
    ("this:x", "this"),  # importing `this` prints the Zen of Python
    ("builtins:print", "builtins"),  # would be called with the whole trace
    ("unittest.__main__:x", "unittest.__main__"),  # runs unittest's command line on import
])
def test_a_config_naming_a_module_imports_and_calls_nothing(cli, write, tmp_path, capsys, monkeypatch, policy,
                                                           module):
    monkeypatch.delitem(sys.modules, "this", raising=False)
    monkeypatch.delitem(sys.modules, "unittest.__main__", raising=False)
    write("f.yaml", FLEET.format(split=policy))
    res = cli("run", "--config", "f.yaml", "--out", "o", "-q")
    assert res.code == 2
    assert res.err.strip() == (f"llm-replay: error: f.yaml: split.policy: {policy!r} names code in module "
                               f"{module!r}; pass --plugin {module} to allow loading it")
    assert "this" not in sys.modules and "unittest.__main__" not in sys.modules
    assert "Beautiful is better" not in res.out and not (tmp_path / "o").exists()


def test_a_module_beside_the_config_is_not_imported(cli, write, tmp_path):
    """The config's folder is no import path: only --plugin FILE.py loads a file."""
    write("beside.py", "import pathlib\npathlib.Path('imported').write_text('yes')\n"
                       "def split(trace, pools):\n    return [0] * trace.height\n")
    write("f.yaml", FLEET.format(split="beside:split"))
    res = cli("run", "--config", "f.yaml", "--out", "o", "-q")
    assert res.code == 2 and "pass --plugin beside" in res.err and not (tmp_path / "imported").exists()
    res = cli("run", "--config", "f.yaml", "--out", "o", "-q", "--plugin", "beside.py")
    assert res.code == 0, res.err
    assert (tmp_path / "imported").exists()


def test_a_plugin_of_one_command_is_not_allowed_in_the_next(cli, write, tmp_path):
    write("f.yaml", FLEET.format(split="my_split:by_index"))
    plugin = str(PLUGINS / "my_split.py")
    assert cli("run", "--config", "f.yaml", "--out", "o", "-q", "--plugin", plugin).code == 0
    res = cli("run", "--config", "f.yaml", "--out", "o2", "-q")
    assert res.code == 2 and "pass --plugin my_split" in res.err


@pytest.mark.parametrize(("flag", "fragment"), [
    ("no_such_module_here", "--plugin no_such_module_here: no module named 'no_such_module_here'"),
    ("missing.py", "--plugin missing.py: no such file"),
    ("bad name.py", "'bad name' is not a Python identifier"),
    ("raises.py", "--plugin raises.py: importing it raised RuntimeError: boom"),
])
def test_a_plugin_that_cannot_load_is_one_line(cli, write, tmp_path, flag, fragment):
    write("raises.py", "raise RuntimeError('boom')\n")
    write("f.yaml", FLEET.format(split="by-workload"))
    res = cli("run", "--config", "f.yaml", "--out", "o", "-q", "--plugin", flag)
    assert res.code == 2 and fragment in res.err and "Traceback" not in res.err, res.err


def test_an_autoscaler_with_the_wrong_arguments_is_refused_before_it_is_called(cli, write, tmp_path):
    write("scalers.py", "def two(ctx, params):\n    raise AssertionError('never called')\n")
    write("f.yaml", """
        model: llama-3.1-8b
        trace: {window: {end_s: 30}}
        pools: [{replicas: 1, autoscaler: {policy: "scalers:two", max_replicas: 2}}]
    """)
    res = cli("run", "--config", "f.yaml", "--out", "o", "-q", "--plugin", "scalers.py")
    assert res.code == 2
    assert "f.yaml: pools[0].autoscaler.policy: autoscaler 'scalers:two' takes (ctx, params); expected a " \
           "function of (ctx, params, state)" in res.err


def test_policies_lists_the_functions_of_a_plugin(cli):
    res = cli("policies", "--json", "--plugin", str(PLUGINS / "my_split.py"), "--plugin", str(PLUGINS / "my_scaler.py"))
    assert res.code == 0, res.err
    import json

    rows = {r["name"]: r for r in json.loads(res.out)}
    assert rows["my_scaler:by_queue"]["family"] == "autoscaler (plugin)"
    assert rows["my_split:by_index"]["family"] == "pool split (plugin)"
    assert rows["my_split:by_index"]["summary"] == "Every other request to pool 1, by index."
    assert "my_split:wrong_arguments" not in rows and "my_split:NOT_A_FUNCTION" not in rows


@pytest.mark.parametrize(("yaml_text", "fragment"), [
    ("pools: [{replica: 2}]", "unknown key 'pools[0].replica' (did you mean 'replicas'?)"),
    ("pools: [{router: least-outstandin}]", "unknown router 'least-outstandin' (did you mean 'least-outstanding'?)"),
    ("pools: [{autoscaler: {policy: kpaa}}]", "unknown autoscaler 'kpaa' (did you mean 'kpa'?)"),
    ("split: {policy: by-workloads}", "unknown pool split 'by-workloads' (did you mean 'by-workload'?)"),
    ("pools: [{admission: {policy: token_bucket}}]", "(did you mean 'token-bucket'?)"),
])
def test_a_typo_gets_a_did_you_mean(cli, write, yaml_text, fragment):
    write("f.yaml", "model: llama-3.1-8b\n" + yaml_text + "\n")
    res = cli("run", "--config", "f.yaml", "--out", "o", "-q")
    assert res.code == 2 and fragment in res.err, res.err


def test_a_plugins_docstring_is_shown_as_text_not_markup(cli, write):
    write("odd.py", 'def scale(ctx, params, state):\n    """Scales [/oops] by [bold]queue."""\n')
    res = cli("policies", "--plugin", "odd.py")
    assert res.code == 0, res.err
    assert "odd:scale: Scales [/oops] by [bold]queue." in res.out


def test_a_plugin_file_may_define_dataclasses_and_may_not_shadow_a_loaded_module(cli, write, monkeypatch):
    write("dc_split.py", "from __future__ import annotations\nfrom dataclasses import dataclass\n\n"
                         "@dataclass\nclass Rule:\n    pool: int = 0\n\n"
                         "def split(trace, pools):\n    return [Rule().pool] * trace.height\n")
    write("json.py", "def split(trace, pools):\n    return [0] * trace.height\n")
    monkeypatch.delitem(sys.modules, "dc_split", raising=False)
    res = cli("policies", "--json", "--plugin", "dc_split.py")
    assert res.code == 0 and "dc_split:split" in res.out, res.err
    res = cli("policies", "--plugin", "json.py")
    assert res.code == 2 and "a module named 'json' is already loaded from elsewhere" in res.err
