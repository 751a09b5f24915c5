"""`bnfix validate torch`: every verdict from a real run on CPU (2 gloo ranks), as a user runs it.

The fixture models are in fixtures/validate/torch_models.py: a ResNet-ish model whose synced run
must match the global batch and whose unsynced run must not, a model normalising with functional
`F.batch_norm` that no conversion can sync (must fail), factories that fail (usage errors), a
rank that dies (the command fails with that rank's error, quickly), and the torchrun path.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, run_bnfix

pytest.importorskip("torch")

MODELS = "fixtures/validate/torch_models.py"
PNG = b"\x89PNG\r\n\x1a\n"
RESNET_ARGS = ("--input-shape", "8,3,16,16", "--steps", "2", "--world-size", "2")


@pytest.fixture(scope="module")
def resnet_run(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("resnet")
    run = run_bnfix("validate", "torch", f"{MODELS}:resnet_ish", *RESNET_ARGS,
                    "--json", str(out / "report.json"), "--plot", str(out / "errors.png"),
                    cwd=REPO, timeout=240)
    return run, out


@pytest.mark.slow
def test_synced_resnet_matches_the_global_batch(resnet_run) -> None:
    run, out = resnet_run
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["schema"] == "bnfix-validate/1" and report["verdict"] == "pass"
    assert report["settings"]["backend"] == "gloo" and report["settings"]["devices"] == 2
    tolerance = report["tolerance"]
    assert tolerance == 1e-4
    synced = {layer["layer"]: layer for layer in report["synced"]["layers"]}
    # every BN layout of the fixture is there and within tolerance
    for name in ("(output)", "(loss)", "(input grad)", "stem.1", "fc.1", "shared_bn",
                 "heads.norm", "layer2.downsample.1"):
        assert synced[name]["max_rel"] < tolerance, synced[name]
    assert synced["stem.1"]["kind"] == "ScaledBatchNorm2d"
    quantities = {t["name"] for t in synced["shared_bn"]["tensors"]}
    assert quantities == {"weight.grad", "bias.grad", "running_mean", "running_var"}
    assert report["synced"]["max_rel"] < tolerance
    assert report["synced"]["replica_drift"] == 0.0
    print(f"\nresnet_ish fp32: synced max rel {report['synced']['max_rel']:.1e}, unsynced "
          f"{report['unsynced']['max_rel']:.1e}, {report['seconds']['total']} s")


@pytest.mark.slow
def test_unsynced_run_shows_the_gap(resnet_run) -> None:
    _, out = resnet_run
    report = json.loads((out / "report.json").read_text())
    unsynced = {layer["layer"]: layer["max_rel"] for layer in report["unsynced"]["layers"]}
    assert unsynced["(output)"] > 1e-2 and unsynced["stem.1"] > 1e-2
    assert report["unsynced"]["max_rel"] > 1e3 * report["synced"]["max_rel"]
    assert report["unsynced"]["replica_drift"] > 1e-3  # the ranks' running stats drift apart


@pytest.mark.slow
def test_conversion_fidelity_and_refusals(resnet_run) -> None:
    _, out = resnet_run
    report = json.loads((out / "report.json").read_text())
    fidelity = {f["name"]: f for f in report["fidelity"]}
    assert fidelity["convert_sync"]["max_abs"] == 0.0 and fidelity["convert_sync"]["converted"] == 9
    assert fidelity["revert_sync"]["max_abs"] == 0.0 and not fidelity["revert_sync"]["problem"]
    assert 0 < fidelity["fold"]["max_rel"] < 1e-5  # folding rounds once
    refused = {r["path"]: r["reason"] for r in fidelity["fold"]["refused"]}
    assert "called 2 times" in refused["shared_bn"]
    # folded into Linear / Conv2d; the BN subclass keeps its scale after its folded BN
    assert {"fc.1", "layer2.downsample.1", "stem.1"}.isdisjoint(refused)
    assert not fidelity["convert_sync"]["problem"] and not fidelity["fold"]["problem"]


@pytest.mark.slow
def test_a_run_where_every_bn_was_refused_says_so(tmp_path: Path) -> None:
    """The cause, not only a FAIL: nothing was synced, in the verdict and in the JSON."""
    run = run_bnfix("validate", "torch", f"{MODELS}:manual_bn", "--input-shape", "8,3,8,8",
                    "--steps", "1", "--json", str(tmp_path / "r.json"), cwd=REPO, timeout=240)
    assert run.returncode == 1, run.stdout + run.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    convert = report["fidelity"][0]
    assert convert["converted"] == 0 and len(convert["refused"]) == 2
    assert "refused every BN layer (2 refused, 0 converted)" in convert["problem"]
    assert report["verdict"] == "fail"
    assert report["failures"][0].startswith("conversion convert_sync: refused every BN layer")
    verdict = next(line for line in run.stdout.splitlines() if line.startswith("verdict:"))
    assert verdict.startswith("verdict: FAIL: the conversion refused every BN layer")
    assert "PROBLEM" in next(line for line in run.stdout.splitlines()
                             if line.strip().startswith("convert_sync"))


@pytest.mark.slow
def test_table_and_figure(resnet_run) -> None:
    run, out = resnet_run
    lines = run.stdout.splitlines()
    assert lines[0] == f"bnfix validate torch {MODELS}:resnet_ish"
    row = next(line for line in lines if line.lstrip().startswith("shared_bn "))
    assert row.split()[1] == "BatchNorm1d" and row.endswith("ok")
    assert lines[-3].startswith("verdict: PASS") and lines[-2].startswith("JSON: ")
    assert (out / "errors.png").read_bytes()[:8] == PNG
    assert run.stderr == ""  # no progress line when stderr is not a terminal


@pytest.mark.slow
def test_functional_batch_norm_cannot_be_synced(tmp_path: Path) -> None:
    """F.batch_norm(training=True) in forward: converting the BN modules leaves per-rank
    statistics behind, and the synced run fails the comparison (exit 1)."""
    run = run_bnfix("validate", "torch", f"{MODELS}:functional_bn", "--input-shape", "8,3,8,8",
                    "--steps", "2", "--dtype", "float64", "--json", str(tmp_path / "r.json"),
                    cwd=REPO, timeout=240)
    assert run.returncode == 1, run.stdout + run.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["verdict"] == "fail" and report["tolerance"] == 1e-10
    failing = {layer["layer"] for layer in report["synced"]["layers"]
               if layer["max_rel"] > report["tolerance"]}
    assert {"(output)", "conv"} <= failing
    assert report["fidelity"][0]["max_abs"] == 0.0  # eval mode cannot show it: training does
    assert "verdict: FAIL" in run.stdout


@pytest.mark.slow
@pytest.mark.parametrize(("spec", "shape", "message"), [
    (f"{MODELS}:raises", "8,3,16,16", "raised RuntimeError: checkpoint weights/resnet.pt"),
    (f"{MODELS}:missing", "8,3,16,16", "has no function `missing`"),
    ("no_such_module:build", "8,3,16,16", "cannot import no_such_module"),
    (f"{MODELS}:resnet_ish", "8,5,16,16", "the model rejects --input-shape 8,5,16,16"),
    (f"{MODELS}:resnet_ish", "1,3,16,16", "a global batch of 1 cannot give each of 2"),
    (f"{MODELS}", "8,3,16,16", "is not MODULE:FACTORY"),
], ids=["factory-raises", "no-factory", "no-module", "bad-shape", "batch-too-small", "no-colon"])
def test_usage_errors_are_one_line(spec: str, shape: str, message: str) -> None:
    run = run_bnfix("validate", "torch", spec, "--input-shape", shape, cwd=REPO)
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr.count("\n") == 1 and message in run.stderr, run.stderr


def test_argparse_rejects_a_malformed_shape() -> None:
    run = run_bnfix("validate", "torch", f"{MODELS}:resnet_ish", "--input-shape", "8,x", cwd=REPO)
    assert run.returncode == 2 and "is not a shape like 8,3,32,32" in run.stderr


@pytest.mark.slow
def test_a_failing_rank_fails_the_command_with_its_error() -> None:
    start = time.perf_counter()
    run = run_bnfix("validate", "torch", f"{MODELS}:fails_on_rank_one", "--input-shape", "8,6",
                    "--timeout", "120", cwd=REPO)
    wall = time.perf_counter() - start
    assert run.returncode == 2
    first = run.stderr.splitlines()[0]
    assert first == ("bnfix: validate torch: rank 1 failed: RuntimeError: CUDA out of memory "
                     "(simulated on rank 1)")
    assert wall < 60  # not the 120 s collective timeout: the parent ends the waiting rank


@pytest.mark.slow
def test_joins_a_torchrun_job(tmp_path: Path) -> None:
    """Under torchrun the command is a rank: rank 0 reports, every rank exits alike."""
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "bnfix",
         "validate", "torch", f"{MODELS}:resnet_ish", "--input-shape", "8,3,16,16", "--steps",
         "2", "--json", str(tmp_path / "r.json")],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("verdict: PASS") == 1  # rank 0 alone prints
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["settings"]["launcher"] == "torchrun" and report["verdict"] == "pass"
    assert report["unsynced"]["max_rel"] > 1e-2


def test_validate_keeps_heavy_imports_in_the_runners() -> None:
    """The CLI, the argument parser and the dispatcher import no framework: `bnfix check`
    stays cheap, and the TF runners' parents never start TensorFlow."""
    probe = ("import sys, bnfix.cli, bnfix.validate.side_by_side, bnfix.validate.command\n"
             "import bnfix.validate.keras_runner, bnfix.validate.tf1_runner\n"
             "bnfix.cli.build_parser()\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in "
             "{'torch', 'tensorflow', 'keras', 'tf_keras', 'matplotlib'}))\n")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                          text=True, check=False)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr
