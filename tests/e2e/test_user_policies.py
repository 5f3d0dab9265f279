"""A user's per-step policy named in a config: every mistake is one line naming the key and the
policy, exit 2, nothing written (issue 12, item 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

PLUGIN = str(Path(__file__).resolve().parents[1] / "fixtures" / "plugins" / "bad_policies.py")
FLEET = """
    model: llama-3.1-8b
    trace: {{window: {{end_s: 20}}}}
    pools:
      - {{name: default, replicas: 2, {pool}}}
"""


def run(cli, write, pool: str, *extra: str):
    write("f.yaml", FLEET.format(pool=pool))
    return cli("run", "--config", "f.yaml", "--out", "o", "-q", "--plugin", PLUGIN, *extra)


@pytest.mark.parametrize(("pool", "message"), [
    ('router: "bad_policies:nope"', "pools[0].router: cannot load router 'bad_policies:nope': module "
     "'bad_policies' has no 'nope'"),
    ('router: "bad_policies:bare"', "router 'bad_policies:bare' is a numba function with no reference twin; wrap "
     "it with policies.user.router(reference=...)"),
    ('router: "bad_policies:first_row"', "router 'bad_policies:first_row' is function, expected a router made with "
     "policies.user.router(reference=...)"),
    ('router: "bad_policies:wrong_signature"', "router 'bad_policies:wrong_signature': its kernel does not compile "
     "for the router signature"),
    ('router: "bad_policies:returns_float"', "router 'bad_policies:returns_float': its kernel returns float64, "
     "expected int64"),
    ('router: "bad_policies:bad_twin"', "router 'bad_policies:bad_twin': its reference twin takes (replicas, "
     "request), expected (replicas, request, params, state)"),
    ('router: "bad_policies:as_cfunc"', "its kernel is a numba cfunc (its exceptions are lost), expected an @njit "
     "function"),
    ('engine: {scheduling_policy: "bad_policies:past_the_end"}', "pools[0].engine.scheduling_policy: queue order "
     "'bad_policies:past_the_end' is a router policy, expected a queue order"),
    ('router: {policy: "bad_policies:past_the_end", slack: 1}', "router 'bad_policies:past_the_end' has no "
     "parameter 'slack'; its parameters: none"),
    ('admission: {policy: "bad_policies:two", params: {limit: fast}}', "admission 'bad_policies:two': limit: got "
     "'fast', expected a finite number"),
])
def test_a_policy_that_cannot_load_is_one_line(cli, write, tmp_path, pool, message):
    res = run(cli, write, pool)
    assert res.code == 2, res.err
    assert res.err.count("\n") == 1 and res.err.startswith("llm-replay: error: f.yaml: "), res.err
    assert message in res.err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("engine", ["numba", "reference"])
@pytest.mark.parametrize(("pool", "message"), [
    ('router: "bad_policies:past_the_end"', "pools[0].router: the router 'bad_policies:past_the_end' returned 2, "
     "expected a row of its replicas view (0 .. 1)"),
    ('router: "bad_policies:raises"', "pools[0].router: the router 'bad_policies:raises' raised ValueError: "
     "no replica fits"),
    ('engine: {scheduling_policy: "bad_policies:nan_key", max_num_seqs: 1}', "pools[0].engine.scheduling_policy: "
     "the queue order 'bad_policies:nan_key' returned nan, expected a sort key (a float that is not NaN)"),
    ('admission: {policy: "bad_policies:two"}', "pools[0].admission.policy: the admission 'bad_policies:two' "
     "returned 2, expected 0 (admit) or 1 (reject)"),
])
def test_a_policy_that_fails_while_running_ends_the_run_naming_it(cli, write, tmp_path, engine, pool, message):
    res = run(cli, write, pool, "--engine", engine)
    assert res.code == 2, res.err
    lines = res.err.splitlines()  # after the trace's note on the rows outside the window
    assert lines[-1] == f"llm-replay: error: f.yaml: {message}" and len(lines) == 2, res.err
    assert not (tmp_path / "o").exists()


def test_a_user_policy_runs_from_the_command_line(cli, write, tmp_path):
    write("f.yaml", FLEET.format(pool='router: "policies.examples:least_waiting_tokens", '
                                      'admission: {policy: "policies.examples:cap_long_prompts", '
                                      'params: {max_prompt_tokens: 1000}}'))
    res = cli("run", "--config", "f.yaml", "--out", "o", "-q", "--plugin", "policies.examples")
    assert res.code == 0, res.err
    import json

    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["rejected_by_reason"].get("admission_policy", 0) > 0


def test_an_installed_entry_point_needs_no_flag(cli, write, tmp_path, monkeypatch):
    """A plugin installed with an `llm_replay.policies` entry point is named by its entry-point name."""
    site = tmp_path / "site"
    (site / "fake_policies-1.0.dist-info").mkdir(parents=True)
    (site / "fake_policies-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-policies\n"
                                                                  "Version: 1.0\n")
    (site / "fake_policies-1.0.dist-info" / "entry_points.txt").write_text(
        "[llm_replay.policies]\nfewest-waiting-tokens = policies.examples:least_waiting_tokens\n")
    monkeypatch.syspath_prepend(str(site))
    write("f.yaml", FLEET.format(pool='router: "fewest-waiting-tokens"'))
    res = cli("run", "--config", "f.yaml", "--out", "o", "-q")
    assert res.code == 0, res.err
    write("g.yaml", FLEET.format(pool='engine: {scheduling_policy: "fewest-waiting-tokens"}'))
    res = cli("run", "--config", "g.yaml", "--out", "o2", "-q")
    assert res.code == 2 and "is a router policy, expected a queue order" in res.err
