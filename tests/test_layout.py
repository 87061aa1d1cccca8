"""The repository's `mininet/` folder must never shadow the real Mininet package."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

from tests.harness import import_graph

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


def _tracked(*patterns: str) -> list[Path]:
    names = subprocess.run(["git", "ls-files", *patterns], cwd=REPO_ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    return [REPO_ROOT / name for name in names]


@functools.cache
def _python_graph() -> dict[str, set[str]]:
    return import_graph.python_graph(REPO_ROOT, _tracked("*.py"))


def test_no_product_module_exists_only_for_tests() -> None:
    """Every module of the product packages is reached from the product itself (its commands, the torch
    backend entry point, the generators the Makefile runs, the launchers, the demo, the benchmarks, the
    emulation, the examples), not only from tests: what only tests need lives in tests/harness."""
    graph = _python_graph()
    pyproject, makefile = (REPO_ROOT / "pyproject.toml").read_text(), (REPO_ROOT / "Makefile").read_text()
    commands = {name for name in graph if f'"{name}:' in pyproject or f"-m {name} " in makefile}
    elsewhere = (*PRODUCT_PACKAGES, "tests", "ptf_tests", "conftest")
    reached = {name for name in graph if name in commands or not name.startswith(elsewhere)}
    reached |= set().union(*(import_graph.reachable(graph, name) for name in reached))
    # importing a.b.c runs the packages a and a.b too
    reached |= {".".join(name.split(".")[:end]) for name in reached for end in range(1, name.count(".") + 1)}
    only_tests = sorted(name for name in graph if name.startswith(PRODUCT_PACKAGES) and name not in reached)
    assert not only_tests, f"modules only tests reach: {only_tests}"


def test_every_c_file_of_the_product_is_built() -> None:
    """No C source under the product packages is left out of setup.py's extensions (built only for tests
    or not at all)."""
    setup = (REPO_ROOT / "setup.py").read_text()
    sources = [path.relative_to(REPO_ROOT).as_posix() for package in PRODUCT_PACKAGES
               for path in (REPO_ROOT / package).rglob("*.[ch]")]
    assert sources, "no C sources found"
    assert not [source for source in sources if f'"{source}"' not in setup], setup


CODEC = "host_agent.codec"
KERNEL_PACKAGES = (f"{CODEC}.cpu", f"{CODEC}.gpu")


def test_the_codec_calls_its_kernels_through_their_faces() -> None:
    """The algorithm (``host_agent/codec/*.py``) and the rest of the product reach the CPU and the GPU
    kernels through each package's face (its ``__init__``), never a module beside it, and only the CPU
    face loads the C extension. (Tests may hold a kernel to its twin directly.)"""
    graph = _python_graph()
    beside = tuple(f"{package}." for package in KERNEL_PACKAGES)
    outside = [name for name in graph
               if name not in KERNEL_PACKAGES and not name.startswith(("tests.", *beside))]
    reaching = sorted(f"{name} -> {target}" for name in outside for target in graph[name]
                      if target.startswith(beside))
    assert not reaching, reaching
    loaders = sorted(import_graph.module_name(REPO_ROOT, path) for path in _tracked("*.py")
                     if any("_kernels" in name for name in _imported_names(path)))
    assert loaders == [f"{CODEC}.cpu"], loaders


def _imported_names(path: Path) -> set[str]:
    import ast

    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(alias.name for alias in node.names)
            names.add(getattr(node, "module", None) or "")
    return names


def test_the_kernels_never_import_the_session_or_the_protocol() -> None:
    """The kernels implement steps; what drives the steps (the session, its rounds, the codec's public
    face) is above them, and nothing they import leads back up there."""
    graph = _python_graph()
    above = {CODEC, f"{CODEC}.session", f"{CODEC}.protocol", f"{CODEC}.local"}
    kernels = [name for name in graph if name.startswith(KERNEL_PACKAGES)]
    assert len(kernels) > 5, kernels
    leading_up = {name: sorted(import_graph.reachable(graph, name) & above) for name in kernels}
    assert not any(leading_up.values()), leading_up


def test_no_python_module_imports_in_a_circle() -> None:
    """No two modules of the tree need each other, directly or round a longer loop: where they would, the
    shared part has a home of its own or the dependency is turned around."""
    found = import_graph.circles(_python_graph())
    assert not found, found


def test_no_c_file_calls_or_includes_in_a_circle() -> None:
    """The same for C: no file includes or calls into a file that leads back to it."""
    graph = import_graph.c_graph(REPO_ROOT, _tracked(*(f"{package}/*.[ch]" for package in PRODUCT_PACKAGES)))
    found = import_graph.circles(graph)
    assert not found, found


def test_the_circle_finder_finds_python_and_c_circles(tmp_path: Path) -> None:
    """The two tests above can fail: a tiny tree with one circle of each kind, and one without."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import shared\n")
    (package / "b.py").write_text("def shared():\n    from . import c\n")
    (package / "c.py").write_text("import pkg.a\nimport os\n")
    (package / "d.py").write_text("from pkg import a\n")
    graph = import_graph.python_graph(tmp_path, package.glob("*.py"))
    assert import_graph.circles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    (package / "x.h").write_text("static inline int twice(int v) { return 2 * v; }\nint one(void);\n")
    (package / "x_one.c").write_text('#include "x.h"\n/* two() */\nint one(void) { return two() - 1; }\n')
    (package / "x_two.c").write_text('#include "x.h"\nint two(void)\n{\n    return twice(one()) ;\n}\n')
    (package / "x_three.c").write_text('#include "x.h"\nstatic int one(void) { return 1; }\n'
                                       'int three(void) { return one() + two(); }\n')
    graph = import_graph.c_graph(tmp_path, package.glob("*.[ch]"))
    assert graph["pkg/x_three.c"] == {"pkg/x.h", "pkg/x_two.c"}
    assert import_graph.circles(graph) == [["pkg/x_one.c", "pkg/x_two.c"]]
