"""scripts/newcomer: the README's quick start and demo, replayed verbatim in a fresh clone and
a fresh virtual environment (installs from the package index: about a minute, so `slow`)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO


@pytest.mark.slow
def test_newcomer_follows_the_readme_verbatim():
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "newcomer")],
                         capture_output=True, text=True, timeout=900, check=False)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    lines = run.stdout.splitlines()
    ran = [line for line in lines if line.startswith("ok ")]
    # install from the clone, from a wheel, check/fix/check, the hook config, pre-commit, demo
    assert len(ran) >= 8, run.stdout
    assert any("bnfix fix --unsafe-fixes ." in line for line in ran)
    assert any("pre-commit install" in line for line in ran)
    assert lines[-1].startswith("newcomer: ")
