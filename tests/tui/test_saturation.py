"""The dashboard's header says each pool's saturation class (summary.json's
`pools.<name>.saturation`): red overloaded, yellow backlogged; a run recorded before the field
opens as before, and a damaged one is one line."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from tests.tui.conftest import AFTER, BEFORE, screen_text
from tests.tui.test_keys import drive
from common.errors import UserError
from tui.app import make_app
from tui.data import load_run
from tui.model import Model
from tui.panels import header_text, saturation_text


def _with_saturation(tmp_path, src, classes: dict[str, str], name: str = "run"):
    """A copy of a recorded run whose summary.json gives the pools these classes."""
    dst = tmp_path / name
    shutil.copytree(src, dst)
    summary = json.loads((dst / "summary.json").read_text())
    for pool, state in classes.items():
        summary["pools"][pool]["saturation"] = {"class": state, "queue_slope_per_s": 1.0}
    (dst / "summary.json").write_text(json.dumps(summary))
    return dst


def _styles(text) -> dict[str, str]:
    return {text.plain[s.start:s.end]: str(s.style) for s in text.spans}


def test_a_replayed_run_shows_its_pools_class_from_its_summary(one_pool_run):
    expected = json.loads((one_pool_run / "summary.json").read_text())["pools"]["default"]["saturation"]["class"]
    run = load_run(one_pool_run)
    assert run.saturation == {"default": expected}
    app = make_app(one_pool_run)

    async def script(pilot):
        header = screen_text(app).splitlines()[0]
        assert re.search(rf"❚❚ \d+x  {expected}\b", header), header

    drive(app, script, size=(120, 30))


def test_a_fleet_names_the_pools_that_were_not_stable_and_each_pool_its_own(tmp_path):
    run = _with_saturation(tmp_path, AFTER, {"chat": "stable", "docs": "overloaded", "batch": "backlogged"})
    model = Model([load_run(run)], None)
    text = saturation_text(model)
    assert text.plain == "  docs overloaded, batch backlogged"
    assert _styles(text)["overloaded"] == "bold red" and _styles(text)["backlogged"] == "bold yellow"
    model.view.scope = "chat"
    assert saturation_text(model).plain == "  stable"
    assert header_text(model, 200).plain.endswith("stable")
    model.view.scope = "docs"
    assert _styles(saturation_text(model))["overloaded"] == "bold red"
    all_stable = _with_saturation(tmp_path, AFTER, dict.fromkeys(("chat", "docs", "batch"), "stable"), "calm")
    assert saturation_text(Model([load_run(all_stable)], None)).plain == "  stable"


def test_compare_mode_shows_both_runs_and_a_run_without_the_field_as_a_dash(tmp_path):
    after = _with_saturation(tmp_path, AFTER, {"chat": "stable", "docs": "stable", "batch": "stable"})
    model = Model([load_run(BEFORE), load_run(after)], None)
    model.view.scope = "chat"
    assert saturation_text(model).plain == "  - vs stable"


def test_a_run_recorded_before_the_field_opens_without_it():
    assert "saturation" not in json.loads((BEFORE / "summary.json").read_text())["pools"]["shared"]
    run = load_run(BEFORE)
    assert run.saturation == {}
    model = Model([run], None)
    assert saturation_text(model).plain == ""
    assert not any(word in header_text(model, 200).plain for word in ("stable", "backlogged", "overloaded"))


def test_a_damaged_class_is_one_line_naming_the_key(tmp_path):
    run = _with_saturation(tmp_path, BEFORE, {"shared": "melting"})
    with pytest.raises(UserError, match=r"summary\.json: pools\.shared\.saturation\.class: got 'melting', "
                                        "expected one of stable, backlogged, overloaded"):
        load_run(run)
