"""`bnfix validate keras`: real MirroredStrategy runs on 2 logical CPU devices, as a user runs
the command (a worker process configures the devices before TensorFlow starts).

Fixtures: fixtures/validate/keras_models.py. The functional model with a nested Sequential is
validated from a `.keras` file the test saves; a BN subclass overriding `_moments` (refused by
bnfix.keras.convert_sync) keeps per-replica statistics, and the command must say so (exit 1).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from conftest import FIXTURES, REPO, run_bnfix

keras = pytest.importorskip("keras")

pytestmark = [pytest.mark.tf, pytest.mark.slow]
MODELS = "fixtures/validate/keras_models.py"
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
PNG = b"\x89PNG\r\n\x1a\n"


def _fixture_module():
    spec = importlib.util.spec_from_file_location("keras_models", FIXTURES / "validate" /
                                                  "keras_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("keras")
    keras.utils.set_random_seed(0)
    _fixture_module().functional_nested().save(out / "nested.keras")
    run = run_bnfix("validate", "keras", "nested.keras", "--input-shape", "8,8,8,3",
                    "--replicas", "2", "--steps", "2", "--json", "report.json", "--plot",
                    "errors.png", cwd=out, env=QUIET, timeout=300)
    return run, out


def test_synced_keras_model_matches_the_global_batch(saved_run) -> None:
    run, out = saved_run
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "pass" and report["kind"] == "keras"
    assert report["settings"]["launcher"] == "MirroredStrategy"
    assert report["settings"]["device"] == "2 logical CPU devices"
    synced = {layer["layer"]: layer for layer in report["synced"]["layers"]}
    assert {"(output)", "(loss)", "(input grad)", "conv", "bn_conv", "block/dense",
            "block/bn_dense", "head"} == set(synced)
    assert synced["block/bn_dense"]["kind"] == "BatchNormalization"
    names = {t["name"] for t in synced["block/bn_dense"]["tensors"]}
    assert names == {"gamma.grad", "beta.grad", "moving_mean", "moving_variance"}
    assert report["synced"]["max_rel"] < report["tolerance"] == 1e-4
    assert report["synced"]["replica_drift"] == 0.0
    fidelity = {f["name"]: f for f in report["fidelity"]}
    assert fidelity["convert_sync"]["converted"] == 2 and fidelity["convert_sync"]["max_abs"] == 0
    assert fidelity["revert_sync"]["max_abs"] == 0 and not fidelity["revert_sync"]["problem"]
    assert (out / "errors.png").read_bytes()[:8] == PNG
    noise = {layer["layer"]: layer["max_rel"] for layer in report["noise"]["layers"]}
    assert set(noise) == set(synced) and 0 < max(noise.values()) < 1e-4
    assert report["summary"] == "PASS: every comparison within tolerance"
    assert report["inconclusive"] == "" and report["causes"] == {}
    print(f"\nkeras nested fp32: synced max rel {report['synced']['max_rel']:.1e}, unsynced "
          f"{report['unsynced']['max_rel']:.1e}, {report['seconds']['total']} s")


def test_unsynced_replicas_show_the_gap_and_drift(saved_run) -> None:
    _, out = saved_run
    report = json.loads((out / "report.json").read_text())
    unsynced = {layer["layer"]: layer["max_rel"] for layer in report["unsynced"]["layers"]}
    assert unsynced["(output)"] > 1e-2 and unsynced["bn_conv"] > 1e-2
    assert report["unsynced"]["replica_drift"] > 1e-3  # moving stats differ per replica


def test_refused_layer_fails_the_synced_comparison(tmp_path: Path) -> None:
    """The model's one BN is refused: the verdict and the JSON say nothing was synchronized
    (not "0 converted ... ok"), and the synced layers fail as a sync bug."""
    run = run_bnfix("validate", "keras", f"{MODELS}:bn_in_custom_moments", "--input-shape",
                    "8,6", "--steps", "2", "--dtype", "float64", "--json",
                    str(tmp_path / "r.json"), cwd=REPO, env=QUIET, timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["verdict"] == "fail" and report["tolerance"] == 1e-10
    refused = report["fidelity"][0]["refused"]
    assert [(r["path"], r["layer_class"]) for r in refused] == [("local_bn", "LocalMomentsBN")]
    assert "overrides _moments()" in run.stdout
    assert report["synced"]["max_rel"] > 1e-2  # per-replica statistics, like unsynced
    assert report["refused_everything"] == ["convert_sync"]
    assert report["summary"].startswith("FAIL: the conversion refused every BN layer (1 refused, "
                                        "0 converted): nothing was synchronized")
    assert "verdict: FAIL: the conversion refused every BN layer" in run.stdout
    assert ("conversion convert_sync: refused every BN layer that needed converting (1): nothing "
            "is synchronized") in report["failures"]
    assert report["causes"]["local_bn"] == "sync"


@pytest.mark.parametrize(("spec", "shape", "message"), [
    (f"{MODELS}:not_a_model", "8,6", "returned a str, not a Keras 3 model"),
    ("missing.keras", "8,6", "missing.keras: no such file"),
    (f"{MODELS}:functional_nested", "8,6", "the model rejects --input-shape 8,6"),
    (f"{MODELS}:changing_architecture", "8,6",
     ("(Dense, weights [(6, 6), (6,)]) where the first had dense (Dense, weights [(6, 5), "
      "(5,)]); the factory must build the same architecture on every call")),
], ids=["not-a-model", "no-file", "bad-shape", "another-architecture-each-call"])
def test_usage_errors_are_one_line(spec: str, shape: str, message: str) -> None:
    run = run_bnfix("validate", "keras", spec, "--input-shape", shape, cwd=REPO, env=QUIET)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and message in run.stderr, run.stderr


def _free_ports(count: int) -> list[int]:
    import socket

    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def test_joins_a_tf_config_multi_worker_job(tmp_path: Path) -> None:
    """Two commands with TF_CONFIG (one per worker): MultiWorkerMirroredStrategy over both, the
    chief (worker 0) reports, the other exits with the same verdict and prints nothing. The
    factory builds auto-named layers, a nested auto-named Sequential and a keras.ops node: each
    of its four calls per process names them anew (conv2d, conv2d_2, ...)."""
    import os
    import subprocess
    import sys

    cluster = {"worker": [f"localhost:{port}" for port in _free_ports(2)]}
    args = [sys.executable, "-m", "bnfix", "validate", "keras", f"{MODELS}:auto_named",
            "--input-shape", "8,8,8,3", "--steps", "2"]
    procs = []
    for index in (1, 0):
        env = {**os.environ, **QUIET, "TF_CONFIG": json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": index}})}
        extra = ["--json", str(tmp_path / "r.json")] if index == 0 else []
        procs.append(subprocess.Popen([*args, *extra], cwd=REPO, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outputs = [proc.communicate(timeout=300) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    assert outputs[0][0] == "" and "verdict: PASS" in outputs[1][0]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["settings"]["launcher"].startswith("MultiWorkerMirroredStrategy")
    assert report["synced"]["max_rel"] < 1e-4
    assert report["unsynced"]["max_rel"] > 1e-2
    synced = {layer["layer"] for layer in report["synced"]["layers"]}
    assert {"conv2d", "batch_normalization", "conv2d_1", "sequential/dense",
            "sequential/batch_normalization_1", "dense_1"} <= synced
    # the Dropout's masks would differ between every run: turned off in all of them
    assert report["settings"]["deterministic"].startswith("1 Dropout/noise layer(s) turned off")


# -- the verdict's logic on measured numbers (bnfix.validate.rounding; no TensorFlow) ---------


def _runs(label: str, errors: dict[str, float], drift: float = 0.0):
    from bnfix.validate.comparison import LayerError, RunComparison

    return RunComparison(label, tuple(LayerError(layer, "" if layer.startswith("(") else "X",
                                                 rel, rel, ()) for layer, rel in errors.items()),
                         drift)


def _validation(synced, unsynced, noise, first=None, float64=None, dtype="float32"):
    from bnfix.validate.comparison import Validation

    settings = {"dtype": dtype, "devices": 2, "replica_word": "replicas", "steps": 2, "lr": 0.1}
    return Validation("keras", "m", settings, 1e-4, (), synced, unsynced, {}, noise, first,
                      float64)


MODEL_ROWS = {"(output)": 1e-6, "(loss)": 1e-6, "(input grad)": 1e-6}


def test_verdict_separates_numerics_from_a_sync_bug():
    from bnfix.validate import rounding
    from bnfix.validate.report import verdict

    unsynced = _runs("unsynced", {**MODEL_ROWS, "bn": 1.0, "conv": 1.0}, drift=0.1)
    noise = _runs("noise", {**MODEL_ROWS, "bn": 1e-4, "conv": 1e-4})
    first = {"synced": _runs("synced", {**MODEL_ROWS, "bn": 5e-4, "conv": 5e-4}),
             "unsynced": unsynced, "noise": noise}
    # within 10x the measured rounding: a pass, above the fixed tolerance
    ok = _validation(_runs("synced", {**MODEL_ROWS, "bn": 5e-4, "conv": 5e-4}), unsynced, noise,
                     first)
    assert ok.passed and verdict(ok).startswith("PASS: within the model's float32 rounding")
    # numerics past the rounding, no sign of a sync bug: float64 is asked for ...
    numerics_first = {**first, "synced": _runs("synced", {**MODEL_ROWS, "bn": 3e-2, "conv": 0})}
    numerics = _validation(_runs("synced", {**MODEL_ROWS, "bn": 3e-2, "conv": 5e-4}), unsynced,
                           noise, numerics_first)
    assert rounding.needs_float64(numerics) and not numerics.passed
    assert verdict(numerics).startswith("FAIL: numerics")
    # ... and settles it both ways
    agree = {"synced": _runs("synced", {"bn": 1e-12}), "noise": _runs("noise", {"bn": 1e-12})}
    settled = _validation(numerics.synced, unsynced, noise, numerics_first, agree)
    assert settled.passed and "float64 rerun agrees" in verdict(settled)
    differ = {"synced": _runs("synced", {"bn": 1e-3}), "noise": _runs("noise", {"bn": 1e-12})}
    bug = _validation(numerics.synced, unsynced, noise, numerics_first, differ)
    assert not bug.passed and verdict(bug).startswith("FAIL: sync bug")
    # replicas whose statistics disagree: a sync bug, never sent to float64
    drifting = _runs("synced", {**MODEL_ROWS, "bn": 0.5, "conv": 0.5}, drift=0.1)
    broken = _validation(drifting, unsynced, noise, {**first, "synced": drifting})
    assert not rounding.needs_float64(broken) and verdict(broken).startswith("FAIL: sync bug")
    # rounding alone moves the output by 50% only after step 1: step 1 is what is judged
    later_noise = _runs("noise", {**MODEL_ROWS, "(output)": 0.5, "bn": 0.5, "conv": 0.5})
    later = _validation(_runs("synced", {**MODEL_ROWS, "(output)": 0.4, "bn": 6.0,
                                         "conv": 0.5}), unsynced, later_noise, first)
    assert rounding.chaotic_later(later) == 0.5 and later.passed
    assert "after step 1 rounding alone moves this model by 5.0e-01" in verdict(later)
    wrong_first = {**first, "synced": _runs("synced", {**MODEL_ROWS, "bn": 0.5, "conv": 5e-4})}
    failed = _validation(later.synced, unsynced, later_noise, wrong_first)
    assert not failed.passed and "bn: max rel error 5.0e-01 on step 1 (sync)" in \
        " ".join(failed.failures)
    # rounding alone moving the first step's input gradient by 20%: inconclusive in float32
    chaotic_noise = _runs("noise", {**MODEL_ROWS, "(input grad)": 0.2, "bn": 1e-4})
    chaotic = _validation(ok.synced, unsynced, chaotic_noise, {**first, "noise": chaotic_noise})
    assert verdict(chaotic).startswith("FAIL: inconclusive") and rounding.needs_float64(chaotic)
