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


PRODUCT_PACKAGES = ("lhc_ina", "host_agent", "controller", "softswitch")


def _module_imports(path: Path) -> set[str]:
    """Every module name ``path`` imports (``a.b`` and ``a.b.c`` for ``from a.b import c``)."""
    import ast

    package = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def test_no_product_module_exists_only_for_tests() -> None:
    """Every module of the product packages is reached from the product itself (its commands, the torch
    backend entry point, the generators the Makefile runs, the launchers, the demo, the benchmarks, the
    emulation, the examples), not only from tests: what only tests need lives in tests/harness."""
    def module(path: Path) -> str:
        parts = path.relative_to(REPO_ROOT).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO_ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    paths = {module(REPO_ROOT / name): REPO_ROOT / name for name in tracked}
    pyproject, makefile = (REPO_ROOT / "pyproject.toml").read_text(), (REPO_ROOT / "Makefile").read_text()
    commands = {name for name in paths if f'"{name}:' in pyproject or f"-m {name} " in makefile}
    elsewhere = (*PRODUCT_PACKAGES, "tests", "ptf_tests", "conftest")
    roots = [path for name, path in paths.items() if name in commands or not name.startswith(elsewhere)]
    reached: set[Path] = set()
    while roots:
        path = roots.pop()
        if path in reached:
            continue
        reached.add(path)
        for name in _module_imports(path):
            parts = name.split(".")
            roots += [paths[m] for m in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if m in paths]
    only_tests = sorted(name for name, path in paths.items()
                        if name.startswith(PRODUCT_PACKAGES) and path not in reached)
    assert not only_tests, f"modules only tests reach: {only_tests}"


def test_every_c_file_of_the_product_is_built() -> None:
    """No C source under the product packages is left out of setup.py's extensions (built only for tests
    or not at all)."""
    setup = (REPO_ROOT / "setup.py").read_text()
    sources = [path.relative_to(REPO_ROOT).as_posix() for package in PRODUCT_PACKAGES
               for path in (REPO_ROOT / package).rglob("*.[ch]")]
    assert sources, "no C sources found"
    assert not [source for source in sources if f'"{source}"' not in setup], setup
