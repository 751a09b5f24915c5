"""`bnfix doctor` usage errors and failures (fast: the commands run are plain Python)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from conftest import run_bnfix


def test_no_command_is_a_one_line_usage_error():
    run = run_bnfix("doctor", "--every", "5")
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "bnfix: doctor: no command after `--` (e.g. `bnfix doctor -- python train.py`)"]


def test_bad_options_are_usage_errors():
    assert run_bnfix("doctor", "--every", "0", "--", sys.executable, "-c", "pass"
                     ).stderr.strip() == "bnfix: doctor: --every must be at least 1"
    bad = run_bnfix("doctor", "--select", "BN9999", "--", sys.executable, "-c", "pass")
    assert bad.returncode == 2 and "unknown rule selector `BN9999`" in bad.stderr
    missing = run_bnfix("doctor", "--", "/nonexistent/python")
    assert missing.returncode == 2 and missing.stderr.startswith("bnfix: doctor: cannot run")


def test_a_command_without_bn_reports_nothing_monitored(tmp_path: Path):
    out = tmp_path / "r.json"
    run = run_bnfix("doctor", "--json", str(out), "--", sys.executable, "-c", "print('hi')")
    assert run.returncode == 2  # nothing recorded is a failure to diagnose, not a clean bill
    assert "hi" in run.stdout and "no BN layer was monitored" in run.stdout
    document = json.loads(out.read_text())
    assert document["schema"] == "bnfix-doctor/1" and document["findings"] == []


def test_a_failing_command_says_so(tmp_path: Path):
    run = run_bnfix("doctor", "--", sys.executable, "-c", "raise SystemExit(3)")
    assert run.returncode == 2
    assert "the command exited with code 3" in run.stdout


def test_doctor_is_listed_in_help():
    assert "doctor" in run_bnfix("--help").stdout
