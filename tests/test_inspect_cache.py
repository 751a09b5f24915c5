"""The inspect cache (`bnfix.artifacts.cache`): a second run reports from it without reading or
importing a framework; a change to any file of an artifact (a TF checkpoint's data shard
included) re-reads exactly that artifact; racy entries are re-read; `--no-cache`; a corrupt
cache file or entry is ignored; the key covers the rules, allow-pickle, the tensor budget and
the readers' library versions; BN902 and internal errors are never cached."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

from bnfix.artifacts import cache as inspect_cache
from bnfix.artifacts import read
from bnfix.artifacts.inspect import inspect_command, inspect_paths

torch = pytest.importorskip("torch")

QUIET = {"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO)}
TF_SCRIPT = """
import sys
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
with tf.Graph().as_default():
    init = tf.compat.v1.constant_initializer
    for name, value in (("gamma", 0.5), ("beta", 0.0), ("moving_mean", 0.0),
                        ("moving_variance", 1.0)):
        tf.compat.v1.get_variable("bn1/" + name, [2], initializer=init(value))
    tf.compat.v1.get_variable("global_step", [], tf.int64, initializer=init(3))
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        saver.save(session, sys.argv[1] + "/model.ckpt", write_meta_graph=False)
"""
TF_PREFIX = "tf/model.ckpt"
TF_DATA = "tf/model.ckpt.data-00000-of-00001"


def _bn_state(mean: float, batches: int) -> dict:
    return {"bn.weight": torch.ones(3), "bn.bias": torch.zeros(3),
            "bn.running_mean": torch.full((3,), mean), "bn.running_var": torch.ones(3),
            "bn.num_batches_tracked": torch.tensor(batches)}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """Three torch checkpoints (one flagged BN201), a garbage `.pt` (BN902, never cached), a TF1
    checkpoint (`.index` + `.data-*`, BN201)."""
    pytest.importorskip("tensorflow")
    root = tmp_path_factory.mktemp("pristine")
    torch.save(_bn_state(0.0, 5), root / "stale.pt")
    torch.save(_bn_state(0.25, 5), root / "healthy.pt")
    torch.save(_bn_state(0.5, 7), root / "other.pt")
    (root / "garbage.pt").write_bytes(b"not a checkpoint")
    (root / "tf").mkdir()
    subprocess.run([sys.executable, "-c", TF_SCRIPT, str(root / "tf")], check=True,
                   env={**os.environ, **QUIET}, capture_output=True, timeout=300)
    return root


@pytest.fixture
def runs(pristine: Path, tmp_path: Path, monkeypatch) -> Path:
    """A fresh copy of the artifacts. The racy window is closed (0 ns) so that files written
    just now are trusted by stat: `test_a_racy_entry_is_read_again` keeps the real one."""
    monkeypatch.setattr(inspect_cache, "RACY_NS", 0)
    return Path(shutil.copytree(pristine, tmp_path / "runs"))


def _inspect(folder: Path, cache: Path, **kwargs):
    return inspect_paths([str(folder)], cache_dir=cache, **kwargs)


def _concise(folder: Path, cache: Path, **kwargs) -> tuple[str, list[str]]:
    result = _inspect(folder, cache, **kwargs)
    lines = sorted(f"{f.path} {f.code} {f.layer} {f.message}" for f in result.findings)
    return "\n".join(lines), sorted(result.cached)


def _names(folder: Path, *names: str) -> list[str]:
    return sorted(str(folder / name) for name in names)


TORCH = ("healthy.pt", "other.pt", "stale.pt")
ALL = (*TORCH, TF_PREFIX)  # what is cached: garbage.pt (BN902) never is


def test_second_run_is_served_from_the_cache_without_importing_a_framework(
        runs, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("BNFIX_CACHE_DIR", str(cache))
    out = _command(runs)
    assert "cached (" not in out and "BN201" in out and "BN902" in out
    assert list(cache.glob("inspect-*.json"))
    # a new interpreter, every artifact cached: neither torch nor tensorflow is imported, and
    # the output equals the cold run's except the header's `cached (read in …)`
    script = ("import io, sys\n"
              "from bnfix.artifacts.inspect import inspect_command\n"
              "out = io.StringIO()\n"
              "code = inspect_command([sys.argv[1]], cache=True, stdout=out, stderr=out)\n"
              "from bnfix.artifacts import cache\n"
              "print(code, sorted(m for m in ('torch', 'tensorflow', 'onnx', 'h5py')"
              " if m in sys.modules))\n"
              "print(out.getvalue(), end='')\n")
    env = {**os.environ, **QUIET, "BNFIX_CACHE_DIR": str(cache)}
    proc = subprocess.run([sys.executable, "-c", script, str(runs)], capture_output=True,
                          text=True, env=env, timeout=120, check=True)
    status, warm = proc.stdout.split("\n", 1)
    assert status == "1 []", proc.stdout + proc.stderr
    assert warm.count("cached (read in") == 4  # the tables: BN902 has none
    assert _timeless(warm) == _timeless(out)
    json_cold = _command(runs, output_format="json", cache=False)
    assert _command(runs, output_format="json") == json_cold  # byte for byte


def _command(folder: Path, **kwargs) -> str:
    out, err = io.StringIO(), io.StringIO()
    assert inspect_command([str(folder)], stdout=out, stderr=err, **kwargs) == 1
    return out.getvalue()


def _timeless(text: str) -> str:
    return re.sub(r"cached \(read in \d+\.\d\d s\)|read in \d+\.\d\d s", "read", text)


def test_a_change_to_one_file_of_a_tf_checkpoint_rereads_exactly_that_artifact(runs, tmp_path):
    cache = tmp_path / "cache"
    cold, cached = _concise(runs, cache)
    assert cached == [] and "tf/model.ckpt BN201 bn1" in cold
    assert _concise(runs, cache) == (cold, _names(runs, *ALL))
    data = runs / TF_DATA
    os.utime(data, ns=(time.time_ns(), data.stat().st_mtime_ns + 1_000_000))  # touched
    assert _concise(runs, cache) == (cold, _names(runs, *TORCH))
    assert _concise(runs, cache)[1] == _names(runs, *ALL)  # re-read, cached again
    # same size, the old modification time put back: the change time still tells
    before = data.stat()
    content = bytearray(data.read_bytes())
    content[-1] ^= 0xFF
    data.write_bytes(bytes(content))
    os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))
    flipped, cached = _concise(runs, cache)
    assert cached == _names(runs, *TORCH) and f"{runs}/{TF_PREFIX} BN902" in flipped  # read
    # a torch checkpoint rewritten with other values: re-read, and its new finding shown
    torch.save(_bn_state(0.0, 7), runs / "other.pt")
    warm, cached = _concise(runs, cache)
    assert cached == _names(runs, "healthy.pt", "stale.pt")
    assert f"{runs}/other.pt BN201" in warm
    # the byte put back: read (and cached) again; then a new shard appears beside it
    content[-1] ^= 0xFF
    data.write_bytes(bytes(content))
    assert _concise(runs, cache)[1] == _names(runs, *TORCH)
    assert _concise(runs, cache)[1] == _names(runs, *ALL)
    (runs / "tf" / "model.ckpt.data-00001-of-00002").write_bytes(b"")
    assert _concise(runs, cache)[1] == _names(runs, *TORCH)


def test_a_racy_entry_is_read_again(runs, tmp_path, monkeypatch):
    """Files modified within 2 s of the run are stored racy: the next run re-reads them."""
    from bnfix import cache as check_cache

    monkeypatch.setattr(inspect_cache, "RACY_NS", check_cache.RACY_NS)
    cache = tmp_path / "cache"
    torch.save(_bn_state(0.5, 9), runs / "fresh.pt")  # written now: racy
    _concise(runs, cache)
    (stored,) = cache.glob("inspect-*.json")
    entries = json.loads(stored.read_text())["entries"]
    assert entries[str(runs / "fresh.pt")]["racy"] is True
    assert str(runs / "fresh.pt") not in _concise(runs, cache)[1]
    old = time.time_ns() - 10 * check_cache.RACY_NS
    os.utime(runs / "fresh.pt", ns=(old, old))  # the change time stays recent: still racy
    assert str(runs / "fresh.pt") not in _concise(runs, cache)[1]


def test_no_cache_flag_and_plot_bypass_reading(runs, tmp_path, monkeypatch, capsys):
    """The command line, in this process (torch is imported already): the cache goes to
    .bnfix_cache/ in the project root (here: the working folder, no pyproject.toml)."""
    from bnfix.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BNFIX_CACHE_DIR", raising=False)
    shutil.rmtree(runs / "tf")

    def run(*flags: str) -> str:
        assert main(["inspect", "runs", *flags]) == 1
        return capsys.readouterr().out

    plain = run("--no-cache")
    assert not (tmp_path / ".bnfix_cache").exists()
    first = run()
    assert "cached (" not in first and list((tmp_path / ".bnfix_cache").glob("inspect-*"))
    assert _timeless(first) == _timeless(plain)
    assert run().count("cached (") == 3
    assert "cached (" not in run("--no-cache")
    pytest.importorskip("matplotlib")
    assert "cached (" not in run("--plot", str(tmp_path / "bn.png"))
    assert (tmp_path / "bn.png").stat().st_size > 0


def test_a_corrupt_cache_file_or_entry_is_ignored(runs, tmp_path):
    cache = tmp_path / "cache"
    cold, _ = _concise(runs, cache)
    (stored,) = cache.glob("inspect-*.json")
    data = json.loads(stored.read_text())
    # an entry with a wrong shape is a miss; the others are still served
    data["entries"][str(runs / "stale.pt")]["findings"] = [["BN201", "x"]]
    stored.write_text(json.dumps(data))
    assert _concise(runs, cache) == (cold, _names(runs, "healthy.pt", "other.pt", TF_PREFIX))
    for garbage in (b"{not json", b"[1, 2]", b'{"format": 1, "entries": 7}', b"\xff\xfe"):
        stored.write_bytes(garbage)
        assert _concise(runs, cache) == (cold, [])
        assert json.loads(stored.read_text())["format"] == inspect_cache.FORMAT  # rewritten
    stored.unlink()
    os.mkfifo(stored)  # read only as a regular file: a FIFO there does not block the run
    assert _concise(runs, cache) == (cold, [])


def test_the_key_covers_rules_allow_pickle_the_budget_and_libraries(runs, tmp_path,
                                                                     monkeypatch):
    key = inspect_cache.cache_key
    rules = frozenset({"BN201", "BN902"})
    keys = {key(rules, False, 1 << 20), key(rules | {"BN202"}, False, 1 << 20),
            key(rules, True, 1 << 20), key(rules, False, 1 << 21)}
    assert f"torch={torch.__version__}" in inspect_cache.library_versions().split(",")
    with monkeypatch.context() as patch:  # e.g. torch upgraded, or tensorflow installed
        patch.setattr(inspect_cache, "library_versions", lambda: "torch=99")
        keys.add(key(rules, False, 1 << 20))
    assert len(keys) == 5
    cache = tmp_path / "cache"
    _concise(runs, cache)
    for options in ({"select": ["BN201"]}, {"max_tensor_bytes": 1 << 20},
                    {"allow_pickle": True}):
        assert _concise(runs, cache, **options)[1] == [], options
        assert _concise(runs, cache, **options)[1] == _names(runs, *ALL), options
    assert len(list(cache.glob("inspect-*.json"))) == 4


def test_bn902_and_internal_errors_are_never_cached(runs, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    shutil.rmtree(runs / "tf")  # torch only here
    cold, _ = _concise(runs, cache)
    assert "garbage.pt BN902" in cold
    assert _concise(runs, cache) == (cold, _names(runs, *TORCH))  # garbage.pt: read again
    (stored,) = cache.glob("inspect-*.json")
    assert sorted(json.loads(stored.read_text())["entries"]) == _names(runs, *TORCH)
    healthy = runs / "healthy.pt"

    def missing(path: str, allow_pickle: bool):
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    def broken(path: str, allow_pickle: bool):
        raise TypeError("an injected bug")

    for reader, mtime in ((missing, 1), (broken, 2)):
        os.utime(healthy, ns=(mtime, mtime))  # changed: read again, by the injected reader
        monkeypatch.setattr(read, "READ", {**read.READ, "torch": reader})
        result = _inspect(runs, cache)
        assert str(healthy) not in result.cached
        assert str(healthy) not in json.loads(stored.read_text())["entries"]  # forgotten
    assert (f"{healthy}: internal error while inspecting it: TypeError: an injected bug"
            in result.internal)
    monkeypatch.setattr(read, "READ", read.READ)
    monkeypatch.undo()
    monkeypatch.setattr(inspect_cache, "RACY_NS", 0)
    assert str(healthy) not in _concise(runs, cache)[1]  # read for real, at last
    assert str(healthy) in _concise(runs, cache)[1]


def test_only_broken_files_write_nothing(tmp_path, monkeypatch):
    """Inspecting a hostile or broken file alone leaves nothing behind (no cache folder)."""
    (tmp_path / "broken.pt").write_bytes(b"PK\x03\x04 truncated zip")
    result = _inspect(tmp_path / "broken.pt", tmp_path / "cache")
    assert [f.code for f in result.findings] == ["BN902"]
    assert not (tmp_path / "cache").exists()


def test_files_only_the_content_or_a_folder_names_are_part_of_the_artifact(tmp_path, monkeypatch):
    """An ONNX model's external data, the checkpoint that appears beside a `.meta`, a file
    added to a SavedModel folder: each change re-reads its artifact."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("tensorflow")
    from onnx import TensorProto, helper, numpy_helper
    from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

    monkeypatch.setattr(inspect_cache, "RACY_NS", 0)
    root, cache = tmp_path / "models", tmp_path / "cache"
    (root / "onnx").mkdir(parents=True)
    stats = [numpy_helper.from_array(torch.full((3,), value).numpy(), name)
             for name, value in (("s", 1.0), ("b", 0.0), ("m", 0.0), ("v", 1.0))]
    graph = helper.make_graph(
        [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], initializer=stats)
    onnx.save_model(helper.make_model(graph), str(root / "onnx" / "bn.onnx"),
                    save_as_external_data=True, location="weights.bin", size_threshold=0)
    meta = meta_graph_pb2.MetaGraphDef()
    meta.meta_info_def.tags.append("train")
    (root / "graph.meta").write_bytes(meta.SerializeToString())
    saved = saved_model_pb2.SavedModel()
    saved.meta_graphs.add().meta_info_def.tags.append("serve")
    (root / "exported").mkdir()
    (root / "exported" / "saved_model.pb").write_bytes(saved.SerializeToString())
    everything = _names(root, "exported", "graph.meta", "onnx/bn.onnx")
    assert _inspect(root, cache).internal == []
    assert sorted(_inspect(root, cache).cached) == everything
    weights = root / "onnx" / "weights.bin"

    def rewrite_weights() -> None:
        weights.write_bytes(weights.read_bytes())  # in place, the same bytes

    def add_checkpoint() -> None:
        (root / "graph.index").write_bytes(b"")  # a checkpoint now beside the graph

    def add_variables() -> None:
        (root / "exported" / "variables").mkdir()
        (root / "exported" / "variables" / "variables.index").write_bytes(b"")

    def undo() -> None:  # what the graph readers would now refuse (BN902) goes away again
        (root / "graph.index").unlink(missing_ok=True)
        shutil.rmtree(root / "exported" / "variables", ignore_errors=True)

    for change, artifact in ((rewrite_weights, "onnx/bn.onnx"), (add_checkpoint, "graph.meta"),
                             (add_variables, "exported")):
        change()
        assert sorted(_inspect(root, cache).cached) == [
            name for name in everything if name != str(root / artifact)], artifact
        undo()
        _inspect(root, cache)  # read again, and stored
