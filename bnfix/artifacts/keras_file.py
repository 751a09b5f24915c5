"""Keras model files: `.keras` (a zip of `config.json` + `model.weights.h5`) and HDF5 `.h5`.

Both are read with zipfile/json/h5py only: no model is rebuilt, so no layer code (custom or
`Lambda`) from the file runs.

In `.keras` the weights are stored by position (`layers/batch_normalization_1/vars/0`), named
after each layer's class in snake case and numbered per container, as Keras' saving code does;
the config says which are BN layers, their user-facing names and whether gamma (`scale`) and
beta (`center`) exist. Legacy `.h5` files name every weight (`bn1/moving_mean:0`).
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from collections.abc import Iterator
from typing import Any

import numpy as np

from bnfix.artifacts.grouping import Group, build_layers, group_keys
from bnfix.artifacts.model import Artifact, ArtifactError

BN_CLASSES = ("BatchNormalization", "SyncBatchNormalization")
STEP_NAMES = ("iteration", "iterations", "iter")
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def _h5py() -> Any:
    try:
        import h5py
    except ImportError as exc:
        raise ArtifactError("reading Keras weights needs h5py (pip install h5py)") from exc
    return h5py


def snake_case(name: str) -> str:
    """Keras' `naming.to_snake_case`: the name a layer's weights are stored under."""
    name = re.sub(r"\W+", "", name)
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()


def bn_paths(config: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, str, list[str]]]:
    """(h5 path, layer name, roles of its vars in order) for each BN layer of a model config."""
    layers = config.get("config", {}).get("layers") if isinstance(config, dict) else None
    if not isinstance(layers, list):
        return
    used: dict[str, int] = {}
    for layer in layers:
        if not isinstance(layer, dict):
            continue
        cls = str(layer.get("class_name", ""))
        stored = snake_case(cls)
        if stored in used:
            used[stored] += 1
            stored = f"{stored}_{used[stored]}"
        else:
            used[stored] = 0
        path = f"{prefix}layers/{stored}"
        cfg = layer.get("config", {}) if isinstance(layer.get("config"), dict) else {}
        if cls in BN_CLASSES:
            roles = (["gamma"] if cfg.get("scale", True) else []) + \
                    (["beta"] if cfg.get("center", True) else []) + ["mean", "var"]
            yield path, str(cfg.get("name", stored)), roles
        else:
            yield from bn_paths(layer, path + "/")


def read_keras_file(path: str) -> Artifact:
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            if "config.json" not in names or "model.weights.h5" not in names:
                raise ArtifactError("not a Keras v3 file: config.json or model.weights.h5 missing "
                                    f"(holds {', '.join(sorted(names)[:5]) or 'nothing'})")
            config = json.loads(archive.read("config.json"))
            weights = archive.read("model.weights.h5")
    except (zipfile.BadZipFile, zipfile.LargeZipFile) as exc:
        raise ArtifactError(f"not a Keras v3 file: {exc}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"corrupt .keras file: config.json is not JSON ({exc})") from exc
    h5py = _h5py()
    artifact = Artifact(path=path, kind="keras")
    try:
        with h5py.File(io.BytesIO(weights), "r") as store:
            groups, names_by_path = [], {}
            for h5path, name, roles in bn_paths(config):
                stored = [f"{h5path}/vars/{i}" for i in range(len(roles))]
                if all(key in store for key in stored):
                    groups.append(Group(h5path, dict(zip(roles, stored))))
                    names_by_path[h5path] = name
            artifact.layers = build_layers(groups, lambda key: store[key][()], "keras",
                                           names_by_path)
            if "optimizer/vars/0" in store:  # Keras 3 optimizers store `iterations` first
                _steps(artifact, store["optimizer/vars/0"][()], "optimizer iterations")
    except OSError as exc:
        raise ArtifactError(f"corrupt .keras file: model.weights.h5 unreadable ({exc})") from exc
    return artifact


def read_h5(path: str) -> Artifact:
    """A legacy Keras HDF5 model (`model.save("m.h5")`) or weights file (`save_weights`)."""
    with open(path, "rb") as fh:
        if fh.read(8) != HDF5_MAGIC:
            raise ArtifactError("not an HDF5 file (no HDF5 signature)")
    h5py = _h5py()
    artifact = Artifact(path=path, kind="keras-h5")
    try:
        with h5py.File(path, "r") as store:
            root = store.get("model_weights", store)
            keys: dict[str, str] = {}  # weight name -> dataset path
            for layer in root:
                names = root[layer].attrs.get("weight_names", [])
                for weight in names:
                    weight = weight.decode() if isinstance(weight, bytes) else str(weight)
                    keys[weight] = f"{root.name}/{layer}/{weight}".lstrip("/")
            if not keys:
                raise ArtifactError("no Keras weights in this HDF5 file (no `weight_names`)")
            groups = group_keys(keys)
            artifact.layers = build_layers(groups, lambda key: store[keys[key]][()], "keras")
            if "optimizer_weights" in store:
                store["optimizer_weights"].visititems(
                    lambda name, obj: _h5_step(artifact, name, obj))
    except (OSError, KeyError, ValueError) as exc:  # h5py: bad file / a listed weight missing
        raise ArtifactError(f"corrupt HDF5 file: {exc}") from exc
    return artifact


def _h5_step(artifact: Artifact, name: str, obj: Any) -> None:
    leaf = name.rsplit("/", 1)[-1].removesuffix(":0")
    if artifact.trained is None and leaf in STEP_NAMES and getattr(obj, "shape", None) == ():
        _steps(artifact, obj[()], "optimizer iterations")


def _steps(artifact: Artifact, value: Any, what: str) -> None:
    steps = int(np.asarray(value).reshape(()))
    artifact.trained = steps > 0
    artifact.trained_evidence = f"{what} = {steps}"
