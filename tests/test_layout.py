"""The repository's `mininet/` folder must never shadow the real Mininet package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_repo_mininet_folder_is_not_a_regular_package() -> None:
    assert (REPO_ROOT / "mininet").is_dir()
    assert not (REPO_ROOT / "mininet" / "__init__.py").exists()


def test_an_installed_mininet_wins_over_the_repo_folder(tmp_path: Path) -> None:
    # A stand-in for the real package, placed *after* the repo root on sys.path: if our folder were a
    # regular package it would be found first and shadow it.
    fake = tmp_path / "site" / "mininet"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("REAL = True\n")
    code = "import sys; sys.path.append(sys.argv[1]); import mininet; print(mininet.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "site")],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True,
    )
    assert out.stdout.strip() == str(fake / "__init__.py")


def _imported_packages(package: str) -> set[str]:
    """The first-party top-level packages that ``package``'s modules import (statically, by ast)."""
    import ast

    found: set[str] = set()
    for path in (REPO_ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
    first_party = {"lhc_ina", "host_agent", "controller", "softswitch", "benchmarks", "lhc_demo", "ptf_tests",
                   "tests", "mininet", "lhc_launch"}
    return found & first_party


def test_layers_import_only_downwards() -> None:
    """A worker installs without the controller (the job protocol is in lhc_ina), the controller without
    softswitch (the launchers above both start them), and packaged code never imports the test
    harnesses."""
    assert _imported_packages("lhc_ina") <= {"lhc_ina"}
    assert _imported_packages("host_agent") <= {"lhc_ina", "host_agent"}
    assert _imported_packages("softswitch") <= {"lhc_ina", "softswitch"}
    assert _imported_packages("controller") <= {"lhc_ina", "controller"}
    assert _imported_packages("lhc_launch") <= {"lhc_ina", "softswitch", "controller", "lhc_launch"}
    for application in ("benchmarks", "lhc_demo"):
        assert not _imported_packages(application) & {"tests", "ptf_tests", "mininet"}, application
