"""The project's machinery: CI runs the README's test command, the wheel ships the rule book,
the demo command works."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import REPO, run_bnfix


def _readme_commands() -> list[str]:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    start = readme.index("## The two commands")
    section = readme[start: readme.index("\n## ", start)]
    return re.findall(r"```sh\n(.+?)\n```", section)


def test_ci_runs_the_readme_test_command():
    demo, tests = _readme_commands()
    assert "pytest" in tests and "bnfix check" in demo
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert tests in ci.splitlines()


def test_demo_command_checks_and_diffs_the_fixture():
    check = run_bnfix("check", "fixtures/seed000", cwd=REPO)
    assert check.returncode == 1 and "Found 5 errors." in check.stdout
    diff = run_bnfix("check", "--diff", "--unsafe-fixes", "fixtures/seed000", cwd=REPO)
    assert diff.returncode == 1 and "+++ b/fixtures/seed000/single_gpu_finetune.py" in diff.stdout


def test_wheel_ships_the_rule_book(tmp_path: Path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(REPO)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("bnfix-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        archive.extractall(tmp_path / "site")
    assert "bnfix/rules/BN001.toml" in names
    assert "bnfix/rules/catalogue/tensorflow.toml" in names
    assert not any(n.startswith(("tests/", "fixtures/")) for n in names)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    code = "import bnfix.rulebook as r, bnfix; print(bnfix.__file__, sorted(r.load_rulebook().rules))"
    out = subprocess.run([sys.executable, "-c", code],
                         cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout
    assert str(tmp_path / "site") in out and "'BN004'" in out


def test_base_install_requires_only_the_lint_path(tmp_path: Path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(REPO)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("bnfix-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith("METADATA"))
        lines = archive.read(metadata).decode().splitlines()
    requires = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")]
    base = sorted(r.split(";")[0].split(">")[0].split("<")[0].split("=")[0].strip()
                  for r in requires if "extra ==" not in r)
    assert base == ["libcst", "tomli"]
    extras = {line.split(":", 1)[1].strip() for line in lines if line.startswith("Provides-Extra:")}
    assert {"torch", "tf", "onnx", "all", "dev"} <= extras
