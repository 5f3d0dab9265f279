"""The README's policy table names every registered policy (one name in one place, documented)."""

from pathlib import Path

from policies.registry import policy_rows


def test_readme_lists_every_policy():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for row in policy_rows():
        assert f"`{row['name']}`" in readme, row["name"]


def test_readme_fleet_config_example_loads(tmp_path):
    from replay.config import load_config

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    example = readme.split("## The fleet config")[1].split("```yaml")[1].split("```")[0]
    path = tmp_path / "fleet.yaml"
    path.write_text(example)
    cfg = load_config(path)
    assert cfg.pools[0].name == "default" and cfg.pools[0].replicas == 4
