"""Hostile and broken artifacts for `inspect` and `convert`, generated on the fly and small on
disk: decompression and allocation bombs (refused before anything is allocated, under an
address-space limit), malformed files each giving one BN902 line while the run goes on, a bnfix
bug on one artifact reported as an internal error without stopping the others, an ONNX model's
external data, `convert -o` to places it cannot write, and the output file's mode.

Every case runs the real command in a subprocess and checks its exit code, that it printed one
line for the case (no traceback), and that nothing outside what was asked changed."""

from __future__ import annotations

import json
import os
import resource
import stat
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import REPO
from hostile import Inflating, write_zip

BOMB = 3_000_000_000  # bytes each bomb declares: more than the address-space limit below
LIMIT = 2 << 30  # RLIMIT_AS of the commands that read a bomb (bnfix + torch + h5py need ~1.2 GB)
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "", "PYTHONIOENCODING": "utf-8"}


def bnfix(*args: str, cwd: Path, limit: int | None = LIMIT, umask: int | None = None,
          timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m bnfix ARGS` under an address-space limit (and a umask)."""
    def prepare() -> None:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        if umask is not None:
            os.umask(umask)

    env = {**os.environ, **QUIET, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "bnfix", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=timeout, preexec_fn=prepare, check=False)


def bn902_lines(run: subprocess.CompletedProcess) -> dict[str, str]:
    """File name -> its BN902 message, from `--output-format concise`; asserts no traceback."""
    assert "Traceback" not in run.stdout + run.stderr, run.stderr[-3000:]
    found = {}
    for line in run.stdout.splitlines():
        path, sep, rest = line.partition(":1:1: BN902 ")
        if sep:
            found[Path(path).name] = rest
    return found


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()}


# -- bombs -------------------------------------------------------------------------------------


def torch_zip_bomb(path: Path) -> Path:
    """A real torch checkpoint whose running_var storage became a 3 GB deflated member."""
    torch = pytest.importorskip("torch")
    plain = path.with_suffix(".plain")
    torch.save({"bn.weight": torch.ones(4), "bn.bias": torch.zeros(4),
                "bn.running_mean": torch.zeros(4), "bn.running_var": torch.ones(4),
                "bn.num_batches_tracked": torch.tensor(5)}, plain)
    with zipfile.ZipFile(plain) as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    plain.unlink()
    storage = next(name for name in members if name.endswith("/data/3"))
    members[storage] = Inflating(BOMB)
    return write_zip(path, members)


def torch_legacy_bomb(path: Path) -> Path:
    """torch's pre-1.6 format declaring a 750M-float storage in its pickle (3 GB allocated by
    torch.load before any data is read); the file holds 4 floats."""
    torch = pytest.importorskip("torch")
    import io

    buffer = io.BytesIO()
    torch.save({"bn.running_mean": torch.zeros(4), "bn.running_var": torch.ones(4)}, buffer,
               _use_new_zipfile_serialization=False)
    data = buffer.getvalue()
    forged = data.replace(b"cpuq\x06K\x04N", b"cpuq\x06J" + struct.pack("<i", BOMB // 4) + b"N",
                          1)
    assert forged != data
    path.write_bytes(forged)
    return path


def h5_bomb(path: Path) -> Path:
    """A 10 KB legacy Keras weights file whose moving_mean declares 3e9 elements (chunked,
    compressed, never written: reading it allocates the fill value 3e9 times)."""
    h5py = pytest.importorskip("h5py")
    import numpy as np

    names = [f"bn/{w}:0" for w in ("gamma", "beta", "moving_mean", "moving_variance")]
    with h5py.File(path, "w") as store:
        layer = store.create_group("bn")
        layer.attrs["weight_names"] = [n.encode() for n in names]
        for name in names:
            if "moving_mean" in name:
                layer.create_dataset(name, shape=(BOMB,), dtype="float32", chunks=(1 << 16,),
                                     compression="gzip")
            else:
                layer.create_dataset(name, data=np.ones(4, "float32"))
    assert path.stat().st_size < 100_000
    return path


def keras_bomb(path: Path) -> Path:
    """A .keras archive whose config.json inflates to 3 GB of spaces."""
    return write_zip(path, {"metadata.json": b"{}", "config.json": Inflating(BOMB, b" "),
                            "model.weights.h5": b""})


@pytest.mark.parametrize("make", [torch_zip_bomb, torch_legacy_bomb, h5_bomb, keras_bomb],
                         ids=["pt-deflated-storage", "pt-legacy-declared-storage",
                              "h5-3e9-elements", "keras-3GB-config"])
def test_bombs_are_refused_before_allocating(tmp_path: Path, make):
    suffix = {"h5_bomb": ".h5", "keras_bomb": ".keras"}.get(make.__name__, ".pt")
    bomb = make(tmp_path / f"bomb{suffix}")
    assert bomb.stat().st_size < 4 << 20  # small on disk
    before = snapshot(tmp_path)
    run = bnfix("inspect", "--output-format", "concise", bomb.name, cwd=tmp_path)
    assert run.returncode == 1, run.stderr[-3000:]
    (message,) = bn902_lines(run).values()
    assert "--max-tensor-bytes" in message or "more than the whole file" in message, message
    assert snapshot(tmp_path) == before


def test_a_lower_budget_refuses_what_the_default_reads(tmp_path: Path):
    torch = pytest.importorskip("torch")
    from bnfix.artifacts.inspect import inspect_paths

    torch.save({"bn.running_mean": torch.zeros(4096), "bn.running_var": torch.ones(4096)},
               tmp_path / "wide.pt")
    assert inspect_paths([str(tmp_path / "wide.pt")]).findings == []
    (finding,) = inspect_paths([str(tmp_path / "wide.pt")], max_tensor_bytes=16 << 10).findings
    assert finding.code == "BN902" and "over the 16.0 KiB limit" in finding.message


def test_convert_refuses_a_keras_bomb(tmp_path: Path):
    keras_bomb(tmp_path / "bomb.keras")
    run = bnfix("convert", "bomb.keras", "--to", "sync", "-o", "out.keras", cwd=tmp_path)
    assert run.returncode == 1, run.stderr[-3000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "--max-tensor-bytes" in lines[0], run.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bomb.keras"]


# -- malformed files: one BN902 line each, the run goes on --------------------------------------


def bad_safetensors(folder: Path) -> list[Path]:
    """Headers whose entries have the wrong types (each once crashed the reader)."""
    def write(name: str, header: object) -> Path:
        raw = header if isinstance(header, bytes) else json.dumps(header).encode()
        path = folder / name
        path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 16)
        return path

    return [write("offsets.safetensors",
                  {"bn.running_mean": {"dtype": "F32", "shape": [4],
                                       "data_offsets": ["0", "16"]}}),
            write("shape.safetensors",
                  {"bn.running_mean": {"dtype": "F32", "shape": ["4"], "data_offsets": [0, 16]}}),
            write("entry.safetensors", {"bn.running_mean": [0, 16]}),
            write("deep.safetensors", b"[" * 100_000 + b"]" * 100_000)]


def deep_keras(folder: Path) -> Path:
    """A .keras whose config.json nests 100,000 deep."""
    depth = 100_000
    config = b'{"config": ' * depth + b"{}" + b"}" * depth
    return write_zip(folder / "deep.keras", {"config.json": config, "model.weights.h5": b""})


def bad_h5_attributes(folder: Path) -> Path:
    """A legacy Keras weights file whose `weight_names` holds numbers."""
    h5py = pytest.importorskip("h5py")
    path = folder / "attrs.h5"
    with h5py.File(path, "w") as store:
        store.create_group("bn").attrs["weight_names"] = [1, 2, 3]
    return path


def test_malformed_files_are_one_line_each_and_the_run_goes_on(tmp_path: Path):
    torch = pytest.importorskip("torch")
    torch.save({"bn.running_mean": torch.zeros(2), "bn.running_var": torch.ones(2)},
               tmp_path / "healthy.pt")
    bad_safetensors(tmp_path)
    deep_keras(tmp_path)
    bad_h5_attributes(tmp_path)
    run = bnfix("inspect", "--output-format", "concise", ".", cwd=tmp_path)
    assert run.returncode == 1, run.stderr[-3000:]
    found = bn902_lines(run)
    assert set(found) == {"offsets.safetensors", "shape.safetensors", "entry.safetensors",
                          "deep.keras", "attrs.h5", "deep.safetensors"}, found
    assert "data_offsets is not two integers" in found["offsets.safetensors"]
    assert "shape is not a list of sizes" in found["shape.safetensors"]
    assert "not an object" in found["entry.safetensors"]
    assert "malformed `weight_names`" in found["attrs.h5"]
    assert "nested too deeply" in found["deep.keras"]
    assert "nested too deeply" in found["deep.safetensors"]
    assert "healthy.pt" not in found and run.stdout.count("BN902") == len(found)


@pytest.mark.slow
@pytest.mark.tf
def test_garbage_variable_bytes_in_a_meta_graph(tmp_path: Path):
    pytest.importorskip("tensorflow")
    from tensorflow.core.protobuf import meta_graph_pb2

    meta = meta_graph_pb2.MetaGraphDef()
    meta.collection_def["variables"].bytes_list.value.append(b"\xff\xfe garbage \x00\x12")
    (tmp_path / "model.meta").write_bytes(meta.SerializeToString())
    run = bnfix("inspect", "--output-format", "concise", "model.meta", cwd=tmp_path, limit=None)
    assert run.returncode == 1, run.stderr[-3000:]
    assert "malformed variable definition in the `variables` collection" in \
        bn902_lines(run)["model.meta"]


def test_an_internal_error_is_reported_and_stops_no_other_artifact(tmp_path: Path):
    """A bug of bnfix's own in one reader (injected: the safetensors reader raises TypeError)
    is one `internal error` line naming the artifact and exit 2; the others are inspected."""
    torch = pytest.importorskip("torch")
    torch.save({"bn.running_mean": torch.zeros(2), "bn.running_var": torch.ones(2),
                "bn.num_batches_tracked": torch.tensor(3)}, tmp_path / "a.pt")
    (tmp_path / "b.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")
    script = ("import sys\n"
              "from bnfix.artifacts import read\n"
              "def broken(path, allow_pickle):\n"
              "    raise TypeError('an injected bug')\n"
              "read.READ['safetensors'] = broken\n"
              "from bnfix.cli import main\n"
              "sys.exit(main(sys.argv[1:]))\n")
    env = {**os.environ, **QUIET, "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, "-c", script, "inspect", "--output-format",
                          "concise", "b.safetensors", "a.pt"], cwd=tmp_path, env=env, text=True,
                         capture_output=True, timeout=300, check=False)
    assert run.returncode == 2
    errors = run.stderr.strip().splitlines()
    expected = ("bnfix: b.safetensors: internal error while inspecting it: TypeError: an "
                "injected bug (a bug in bnfix: please report it)")
    assert errors == [expected], run.stderr
    assert "a.pt:1:1: BN201" in run.stdout  # the artifact after it was inspected


# -- discovery -----------------------------------------------------------------------------------


def test_onnx_external_weights_are_not_an_artifact_of_their_own(tmp_path: Path):
    onnx = pytest.importorskip("onnx")
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(v).astype(np.float32), name)
             for name, v in (("W", (4, 3, 3, 3)), ("s", 4), ("b", 4), ("m", 4))]
    inits.append(numpy_helper.from_array(np.ones(4, np.float32), "v"))
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "W"], ["c"]),
         helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 3, 3])], inits)
    onnx.save(helper.make_model(graph), tmp_path / "model.onnx", save_as_external_data=True,
              all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    assert (tmp_path / "weights.bin").is_file()
    run = bnfix("inspect", "--output-format", "concise", ".", cwd=tmp_path)
    assert bn902_lines(run) == {}
    assert "model.onnx:1:1: BN208" in run.stdout  # the model itself is read, data and all
    named = bnfix("inspect", "--output-format", "concise", "weights.bin", cwd=tmp_path)
    assert "not a PyTorch checkpoint" in bn902_lines(named)["weights.bin"]  # named: still said


# -- convert -o --------------------------------------------------------------------------------


@pytest.fixture
def onnx_model(tmp_path: Path) -> Path:
    """A training-mode BN model (convertible --to inference)."""
    onnx = pytest.importorskip("onnx")
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.full(3, v, np.float32), n)
             for n, v in (("s", 1.5), ("b", 0.1), ("m", 0.2), ("v", 2.0))]
    graph = helper.make_graph(
        [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"],
                          training_mode=1)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])], inits)
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)]), path)
    return path


@pytest.mark.parametrize(("output", "message"), [
    ("{tmp}", "is a folder"),
    ("{tmp}/missing/out.onnx", "the folder {tmp}/missing does not exist"),
    ("/proc/out.onnx", "cannot write into /proc"),
], ids=["folder", "missing-folder", "read-only-place"])
def test_convert_output_that_cannot_be_written_is_a_usage_error(onnx_model, output, message):
    tmp = onnx_model.parent
    before = snapshot(tmp)
    run = bnfix("convert", onnx_model.name, "--to", "inference", "-o",
                output.format(tmp=tmp), cwd=tmp, limit=None)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and message.format(tmp=tmp) in lines[0], run.stderr
    assert run.stdout == "" and snapshot(tmp) == before


def test_convert_output_modes(onnx_model):
    tmp = onnx_model.parent
    for umask, mode in ((0o022, 0o644), (0o077, 0o600)):
        out = tmp / f"new-{umask:o}.onnx"
        run = bnfix("convert", onnx_model.name, "--to", "inference", "-o", out.name, cwd=tmp,
                    limit=None, umask=umask)
        assert run.returncode == 0, run.stderr
        assert stat.S_IMODE(out.stat().st_mode) == mode
    existing = tmp / "existing.onnx"
    existing.write_bytes(b"old")
    existing.chmod(0o640)
    run = bnfix("convert", onnx_model.name, "--to", "inference", "-o", existing.name, cwd=tmp,
                limit=None, umask=0o022)
    assert run.returncode == 0, run.stderr
    assert stat.S_IMODE(existing.stat().st_mode) == 0o640 and existing.read_bytes() != b"old"
    assert not [p for p in tmp.iterdir() if p.name.startswith(".")]  # no temporary left
