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
