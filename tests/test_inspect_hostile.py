"""Hostile and broken inputs: each gives one BN902 line and the run goes on. A pickle with a
malicious `__reduce__` must never run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import run_bnfix

from bnfix.artifacts.inspect import inspect_paths


class Payload:
    """Unpickling this writes the marker file (os.system would do anything else as well)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


def unreadable(paths: list[Path], **kwargs) -> dict[str, str]:
    result = inspect_paths([str(p) for p in paths], **kwargs)
    assert all(f.code == "BN902" and f.layer == "" for f in result.findings)
    return {Path(f.path).name: f.message for f in result.findings}


def test_malicious_pickle_does_not_execute(tmp_path):
    torch = pytest.importorskip("torch")
    marker = tmp_path / "PWNED"
    torch.save(Payload(str(marker)), tmp_path / "evil.pt")
    with open(tmp_path / "evil.pkl.bin", "wb") as fh:  # a raw pickle, as torch's legacy format
        import pickle

        pickle.dump(Payload(str(marker)), fh, protocol=2)
    messages = unreadable([tmp_path / "evil.pt", tmp_path / "evil.pkl.bin"])
    assert not marker.exists(), "the pickle's payload ran"
    for message in messages.values():
        assert message.startswith("refused: the file is a pickled Python object")
        assert "(it references `posix.system`)" in message and "--allow-pickle" in message


def test_full_pickled_model_needs_allow_pickle(tmp_path):
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 2, 3), torch.nn.BatchNorm2d(2))
    torch.save(model, tmp_path / "full.pt")
    refused = unreadable([tmp_path / "full.pt"])
    assert "torch.nn.modules.container.Sequential" in refused["full.pt"]
    allowed = inspect_paths([str(tmp_path / "full.pt")], allow_pickle=True)
    assert allowed.findings == []
    (artifact,) = allowed.artifacts
    assert artifact.kind == "torch-module" and [layer.name for layer in artifact.layers] == ["1"]
    assert "1 saved in train mode" in artifact.notes


def test_truncated_wrong_and_missing_files(tmp_path):
    torch = pytest.importorskip("torch")
    torch.save({"bn.running_mean": torch.zeros(4), "bn.running_var": torch.ones(4)},
               tmp_path / "good.pt")
    data = (tmp_path / "good.pt").read_bytes()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 2])
    (tmp_path / "readme.pt").write_text("not a checkpoint\n")
    (tmp_path / "empty.safetensors").write_bytes(b"")
    (tmp_path / "text.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json here!!!")
    (tmp_path / "fake.keras").write_text("PK but not really")
    (tmp_path / "fake.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\x00" * 64)
    (tmp_path / "weights.bin").write_bytes(b"\x00\x01\x02")
    messages = unreadable(sorted(tmp_path.iterdir()) + [tmp_path / "missing.pt"])
    assert set(messages) == {"truncated.pt", "readme.pt", "empty.safetensors", "text.safetensors",
                             "fake.keras", "fake.h5", "weights.bin", "missing.pt"}
    assert messages["truncated.pt"].startswith("unreadable PyTorch checkpoint (truncated or "
                                               "corrupt?): PytorchStreamReader failed")
    assert messages["readme.pt"] == ("not a PyTorch checkpoint: neither a zip archive nor a "
                                     "pickle (starts with b'not a ch')")
    assert "shorter than its header" in messages["empty.safetensors"]
    assert "the header is not JSON" in messages["text.safetensors"]
    assert messages["fake.keras"].startswith("not a Keras v3 file")
    assert messages["fake.h5"].startswith("corrupt HDF5 file")
    assert messages["missing.pt"] == "no such file or folder"
    for message in messages.values():
        assert "\n" not in message and len(message) < 300


def test_truncated_safetensors_data(tmp_path):
    header = json.dumps({"bn.running_mean": {"dtype": "F32", "shape": [4],
                                             "data_offsets": [0, 16]}}).encode()
    blob = len(header).to_bytes(8, "little") + header + b"\x00" * 8  # 8 of 16 data bytes
    (tmp_path / "cut.safetensors").write_bytes(blob)
    assert "truncated safetensors file" in unreadable([tmp_path / "cut.safetensors"])[
        "cut.safetensors"]


def test_cli_keeps_going_and_empty_folder_warns(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.pt").write_text("hello")
    header = json.dumps({"bn.running_mean": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                         "bn.running_var": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})
    blob = len(header).to_bytes(8, "little") + header.encode() + \
        b"\x00\x00\x00\x00" + b"\x00\x00\x80\x3f"
    (tmp_path / "ok.safetensors").write_bytes(blob)
    run = run_bnfix("inspect", "empty", "bad.pt", "ok.safetensors", "--output-format", "concise",
                    cwd=tmp_path)
    assert run.returncode == 1
    assert "bnfix: warning: no artifacts found under empty" in run.stderr
    assert run.stdout == ("bad.pt:1:1: BN902 not a PyTorch checkpoint: neither a zip archive nor "
                          "a pickle (starts with b'hello')\nFound 1 error.\n")
    alone = run_bnfix("inspect", "empty", cwd=tmp_path)
    assert alone.returncode == 0 and "no artifacts found under empty" in alone.stderr
