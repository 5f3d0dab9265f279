"""The README's policy table names every registered policy (one name in one place, documented)."""

from pathlib import Path

from policies.registry import policy_rows


def test_readme_lists_every_policy():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for row in policy_rows():
        assert f"`{row['name']}`" in readme, row["name"]
