"""pyproject.toml lists its packages by hand (`package-dir = {apexrl = "services"}`): every
folder of services/ with an __init__.py is in that list, or a regular install (the container
images') would lack it while an editable one still finds it."""

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_package_under_services_is_installed():
    listed = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(["apexrl", *init.parent.relative_to(REPO / "services").parts])
        for init in (REPO / "services").rglob("__init__.py")
    }
    assert "apexrl.replay" in found
    assert sorted(found - listed) == []
    assert sorted(listed - found) == []
