"""Seed 000 through the TF graph front-end: the fixture's TF1 programs run unchanged (for one
step, on logical CPU devices), their graphs are exported as MetaGraphs, and `read_tf_graph`
finds the bugs' graph symptoms before `bnfix fix --unsafe-fixes` and none after it.

What the real graphs show (and why BN204 needs the BN001-only fix to appear): in the original
multi-tower program the BN layers are built with `trainable=False`, and a non-trainable Keras
layer publishes no UPDATE_OPS, so *no* update is wired to the train op (BN203) -- the
unscoped collection (BN002) only duplicates updates (BN204) once BN001 is fixed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import FIXTURES, REPO, fix_into, has_tf1_layers, run_bnfix

SEED = FIXTURES / "seed000"
PROGRAMS = ("multi_gpu_train.py", "single_gpu_finetune.py")
EXPORTER = REPO / "tests" / "programs" / "tfgraph_export.py"
FROZEN = REPO / "tests" / "programs" / "tfgraph_frozen.py"
MOVING_VARS = 6  # mean and variance of the 3 BN layers of the multi-tower program

pytestmark = [pytest.mark.slow, pytest.mark.tf]


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """Export every program's graph in one TensorFlow process; returns name -> Artifact."""
    if not has_tf1_layers():
        pytest.skip("needs tensorflow and tf-keras (pip install --no-deps tf-keras)")
    root = tmp_path_factory.mktemp("seed_graphs")
    fixed = root / "fixed"
    fixed.mkdir()
    fix_into(SEED, PROGRAMS, fixed)  # bnfix fix --unsafe-fixes, checked against fixed/
    bn001 = root / "bn001"  # only BN001 fixed: the towers' updates become visible
    bn001.mkdir()
    shutil.copy(SEED / "multi_gpu_train.py", bn001 / "multi_gpu_train.py")
    run = run_bnfix("fix", "--unsafe-fixes", "--select", "BN001", ".", cwd=bn001)
    assert "1 fixed" in run.stdout, run.stdout + run.stderr
    towers = ["--num-gpus", "2", "--device", "cpu", "--steps", "1"]
    jobs = {
        "original-multi": (SEED / "multi_gpu_train.py", towers),
        "original-single": (SEED / "single_gpu_finetune.py", ["--steps", "1"]),
        "bn001-multi": (bn001 / "multi_gpu_train.py", towers),
        "fixed-multi": (fixed / "multi_gpu_train.py", towers),
        "fixed-single": (fixed / "single_gpu_finetune.py", ["--steps", "1"]),
    }
    spec = [{"program": str(program), "args": args, "meta": str(root / f"{name}.meta"),
             "checkpoint": str(root / name / "model.ckpt")}
            for name, (program, args) in jobs.items()]
    spec.append({"program": str(FROZEN), "args": [str(root)]})
    (root / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
           "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(EXPORTER), str(root / "spec.json")], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    from bnfix.tfgraph.read import read_tf_graph

    out = {name: read_tf_graph(str(root / f"{name}.meta")) for name in jobs}
    for name in ("frozen_train_mode.pb", "frozen_unfolded.pb", "saved_model"):
        out[name] = read_tf_graph(str(root / name))
    out["root"] = root
    return out


def reachable_counts(artifact) -> dict[str, int]:
    return {var: len(ops) for var, ops in artifact.graph.reachable_updates.items()}


def test_single_device_original_never_runs_its_updates(graphs):
    g = graphs["original-single"].graph
    assert g.train_ops == ["Adam"]
    assert sorted(g.update_ops) == ["bn1/moving_mean", "bn1/moving_variance",
                                    "bn2/moving_mean", "bn2/moving_variance"]
    assert all(len(ops) == 1 for ops in g.update_ops.values())
    assert reachable_counts(graphs["original-single"]) == dict.fromkeys(g.update_ops, 0)  # BN203


def test_single_device_fixed_runs_each_update_once(graphs):
    g = graphs["fixed-single"].graph
    assert reachable_counts(graphs["fixed-single"]) == dict.fromkeys(g.update_ops, 1)


def test_multi_tower_original_updates_nothing_and_averages_the_stats(graphs):
    artifact = graphs["original-multi"]
    g = artifact.graph
    assert g.train_ops == ["group_deps"]  # tf.group(apply_gradient_op, variables_averages_op)
    assert len(g.update_ops) == MOVING_VARS
    assert all(len(ops) == 2 for ops in g.update_ops.values())  # one per tower
    assert set(reachable_counts(artifact).values()) == {0}  # BN203 (masks BN204, see above)
    assert len(g.ema_shadows) == MOVING_VARS  # BN205
    assert all(shadow == f"{var}/ExponentialMovingAverage" for shadow, var in g.ema_shadows)
    assert artifact.distributed


def test_multi_tower_with_bn001_fixed_updates_every_stat_once_per_tower(graphs):
    artifact = graphs["bn001-multi"]
    assert set(reachable_counts(artifact).values()) == {2}  # BN204: both towers' updates
    assert len(artifact.graph.ema_shadows) == MOVING_VARS


def test_multi_tower_fixed_updates_once_from_one_tower_without_shadows(graphs):
    artifact = graphs["fixed-multi"]
    g = artifact.graph
    assert set(reachable_counts(artifact).values()) == {1}
    assert all(ops[0].startswith("tower_1/") for ops in g.reachable_updates.values())
    assert g.ema_shadows == []
    assert [layer.name for layer in artifact.layers] == [
        "bn_conv1/BatchNorm/bn", "bn2a_branch2a/BatchNorm/bn", "bn2a_branch2b/BatchNorm/bn"]


def test_tf_frozen_graphs(graphs):
    train_mode = graphs["frozen_train_mode.pb"].graph
    assert train_mode.inference and train_mode.training_mode_nodes == ["bn1/FusedBatchNormV3"]
    unfolded = graphs["frozen_unfolded.pb"]
    assert unfolded.graph.unfolded == [("conv1/Conv2D", "bn1/FusedBatchNormV3")]
    assert unfolded.graph.training_mode_nodes == []
    (layer,) = unfolded.layers
    assert layer.mean.tolist() == [0.25, -0.5, 1.0, 2.0]  # frozen Const values
    saved = graphs["saved_model"]
    assert saved.kind == "tf-saved-model" and saved.graph.unfolded == unfolded.graph.unfolded
    assert saved.layers[0].var.tolist() == [1.0, 4.0, 0.25, 9.0]  # from variables/ checkpoint


def test_inspect_finds_the_fingerprints_before_the_fix_and_none_after(graphs):
    """`bnfix inspect` on what the programs left behind, the MetaGraph and the checkpoint each
    saved when its session closed: the bugs' fingerprints before the fix, nothing after it."""
    root = graphs["root"]
    names = ("original-multi", "original-single", "fixed-multi", "fixed-single")
    paths = [f"{name}.meta" for name in names] + [f"{name}/model.ckpt.index" for name in names]
    run = run_bnfix("inspect", "--output-format", "json", *paths, cwd=root, timeout=300)
    assert run.returncode == 1, run.stderr[-2000:]
    found: dict[str, set[str]] = {}
    for record in json.loads(run.stdout):
        found.setdefault(os.path.relpath(record["filename"], root), set()).add(record["code"])
    assert found == {
        # BN001 (trainable=False) leaves gamma/beta at 1/0 and publishes no update ops (BN203,
        # stats at 0/1: BN201); BN004 leaves EMA shadows of the moving stats (BN205)
        "original-multi.meta": {"BN203", "BN205"},
        "original-multi/model.ckpt": {"BN201", "BN202", "BN205"},
        # BN003: the update ops never reach the train op
        "original-single.meta": {"BN203"},
        "original-single/model.ckpt": {"BN201"},
    }, found
