"""`bnfix doctor -- python fixtures/doctor/torch_train.py --bug X`: small real CPU trainings
broken on purpose each give their diagnosis, the healthy one none; the JSON and HTML reports;
`--steps`; a two-rank torchrun job merged across ranks."""

from __future__ import annotations

import base64
import json
import re
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, REPO, run_bnfix

pytest.importorskip("torch")
pytestmark = pytest.mark.slow
TRAIN = FIXTURES / "doctor" / "torch_train.py"
DDP = FIXTURES / "doctor" / "torch_ddp.py"
ENV = {"OMP_NUM_THREADS": "1"}
EXPECTED = {
    "batch2": {("BN301", layer) for layer in ("bn1", "bn2", "bn3")},
    "gamma-lr": {("BN308", "bn3")},
    "no-eval": {("BN304", layer) for layer in ("bn1", "bn2", "bn3")},
    "momentum": {("BN303", layer) for layer in ("bn1", "bn2", "bn3")},
    "frozen-eval": {("BN305", layer) for layer in ("bn1", "bn2", "bn3")},
}


def _doctor(tmp_path: Path, *command: str, options: tuple[str, ...] = ()) -> tuple:
    out = tmp_path / "report.json"
    run = run_bnfix("doctor", "--json", str(out), *options, "--", sys.executable, *command,
                    cwd=tmp_path, env=ENV, timeout=300)
    assert out.exists(), run.stdout + run.stderr
    return run, json.loads(out.read_text())


@pytest.mark.parametrize("bug", sorted(EXPECTED))
def test_each_broken_training_gives_its_diagnosis(bug, tmp_path):
    run, document = _doctor(tmp_path, str(TRAIN), "--bug", bug)
    found = {(f["code"], f["layer"]) for f in document["findings"]}
    assert found == EXPECTED[bug], run.stdout
    assert run.returncode == 1
    code = next(iter(EXPECTED[bug]))[0]
    assert f"  {code} " in run.stdout and "fix: " in run.stdout


def test_the_healthy_training_gives_none_and_writes_both_reports(tmp_path):
    html = tmp_path / "report.html"
    run, document = _doctor(tmp_path, str(TRAIN), options=("--html", str(html), "--every", "5"))
    assert run.returncode == 0, run.stdout
    assert "no BN problem found" in run.stdout and document["findings"] == []
    assert document["schema"] == "bnfix-doctor/1" and document["every"] == 5
    (recording,) = document["recordings"]
    assert recording["steps"] == 60 and set(recording["layers"]) == {"bn1", "bn2", "bn3"}
    page = html.read_text()
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert len(images) == 3  # one figure per layer
    assert all(base64.b64decode(i).startswith(b"\x89PNG") and len(i) > 10_000 for i in images)
    for title in ("γ / β", "batch vs running statistics", "dead channels", "train/eval gap"):
        assert title not in page  # drawn in the images, not as text
    assert "No BN problem found" in page


def test_findings_are_ruff_shaped_records(tmp_path):
    _, document = _doctor(tmp_path, str(TRAIN), "--bug", "gamma-lr")
    (record,) = document["findings"]
    assert set(record) >= {"code", "name", "filename", "location", "end_location", "message",
                           "noqa_row", "url", "fix"}
    assert record["filename"] == str(TRAIN) and record["name"] == "gamma-beta-oscillation"
    assert record["fix"]["applicability"] == "display-only" and record["fix"]["message"]
    assert record["layer"] == "bn3" and record["steps"][0] == 1
    assert record["numbers"]["gamma_step"] > 0.05 and record["message"].startswith("bn3: ")


def test_steps_stops_the_training(tmp_path):
    run, document = _doctor(tmp_path, str(TRAIN), options=("--steps", "12", "--every", "4"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "stopping after 12 training steps" in run.stderr
    assert "stopped by --steps" in run.stdout and "bug=" not in run.stdout  # never finished
    (recording,) = document["recordings"]
    assert recording["steps"] == 12 and recording["stopped"] is True
    assert [s["step"] for s in recording["layers"]["bn1"]["samples"]] == [1, 5, 9]


def test_a_two_rank_torchrun_job_is_merged(tmp_path):
    run, document = _doctor(
        tmp_path, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(DDP), "--broadcast-buffers", "off", "--shards", "by-class")
    assert run.returncode == 1, run.stdout + run.stderr
    assert sorted(r["rank"] for r in document["recordings"]) == [0, 1]
    assert {r["world"] for r in document["recordings"]} == {2}
    small = {f["layer"]: f["ranks"] for f in document["findings"] if f["code"] == "BN301"}
    assert small == {"bn1": [0, 1], "bn2": [0, 1], "bn3": [0, 1]}
    disagree = {f["layer"] for f in document["findings"] if f["code"] == "BN310"}
    assert "bn1" in disagree
    assert {g["layer"] for g in document["ranks"]} == {"bn1", "bn2", "bn3"}
    assert "ranks compared" in run.stdout and "[ranks 0, 1]" in run.stdout


def test_the_readme_command_form_works_from_the_repository(tmp_path):
    """`bnfix doctor -- python train.py` with a relative script path, from the script's folder."""
    run = run_bnfix("doctor", "--steps", "3", "--every", "1", "--", sys.executable,
                    str(TRAIN.relative_to(REPO)), cwd=REPO, env=ENV, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "torch model Sequential (3 BN layers, 3 training steps)" in run.stdout
