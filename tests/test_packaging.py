"""pyproject.toml lists every package of the source tree (an installed wheel holds only those)."""

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
ROOT = Path(__file__).resolve().parent.parent


def test_every_package_is_listed():
    """A non-editable install holds only the listed packages: ops/moe and ops/attention were missing,
    and ``import qfuse`` failed there (an editable install, as ``make`` makes, found them anyway)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = config["package-dir"]
    found = set()
    for package, folder in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            if not any(part.startswith((".", "__")) for part in rel):
                found.add(".".join((package, *rel)))
    assert set(config["packages"]) == found
