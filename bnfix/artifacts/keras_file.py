"""Keras model files: `.keras` (a zip of `config.json` + `model.weights.h5`), Keras 3 weights
files (`.weights.h5`) and legacy HDF5 `.h5` models and weights.

All are read with zipfile/json/h5py only: no model is rebuilt, so no layer code (custom or
`Lambda`) from the file runs.

Keras 3 stores each layer's variables by position (`layers/batch_normalization_1/vars/0`) in a
group named after the layer's class in snake case (numbered per container) or, in subclassed
models, after the attribute holding it (`bn/vars/0`); Keras 3.15 also writes the layer's name
on its `vars` group. A BN layer is found
- by the config of a functional/Sequential `.keras` model (its name, and whether gamma (`scale`)
  and beta (`center`) exist), or else
- by its stored group: named like a BN class (`batch_normalization_3`) — any of its 2 to 4
  vectors are then mean and variance last — or holding exactly four vectors of one length
  (gamma, beta, moving mean, moving variance: no other Keras layer stores that).
Legacy `.h5` files name every weight (`bn1/moving_mean:0`).

Sizes are checked before reading (`bnfix.artifacts.limits`): the zip members, and each dataset's
declared shape (an HDF5 dataset can declare 3e9 elements in a 10 KB file).
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
from bnfix.artifacts.limits import check
from bnfix.artifacts.model import Artifact, ArtifactError

BN_CLASSES = ("BatchNormalization", "SyncBatchNormalization")
BN_STORED = re.compile(r"^(sync_)?batch_normalization(_\d+)?$")
STEP_NAMES = ("iteration", "iterations", "iter")
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
MAX_DEPTH = 100  # containers nested deeper than this in a config are not followed


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


def bn_paths(config: Any) -> Iterator[tuple[str, str, list[str]]]:
    """(h5 path, layer name, roles of its vars in order) for each BN layer of a model config.
    Iterative: a config nested thousands deep is not followed past MAX_DEPTH."""
    stack: list[tuple[Any, str, int]] = [(config, "", 0)]
    while stack:
        node, prefix, depth = stack.pop()
        inner = node.get("config") if isinstance(node, dict) else None
        layers = inner.get("layers") if isinstance(inner, dict) else None
        if not isinstance(layers, list) or depth > MAX_DEPTH:
            continue
        used: dict[str, int] = {}
        nested = []
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
            cfg = layer.get("config") if isinstance(layer.get("config"), dict) else {}
            if cls in BN_CLASSES:
                roles = (["gamma"] if cfg.get("scale", True) else []) + \
                        (["beta"] if cfg.get("center", True) else []) + ["mean", "var"]
                yield path, str(cfg.get("name", stored)), roles
            else:
                nested.append((layer, path + "/", depth + 1))
        stack.extend(reversed(nested))


def _member(archive: zipfile.ZipFile, name: str) -> bytes:
    """A member's bytes, its declared size checked first and the read capped at it."""
    info = archive.getinfo(name)
    check(f"`{name}` in the archive", info.file_size)
    with archive.open(info) as fh:
        data = fh.read(info.file_size + 1)
    if len(data) > info.file_size:
        raise ArtifactError(f"`{name}` in the archive inflates past its declared size")
    return data


def read_keras_file(path: str) -> Artifact:
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            if "config.json" not in names or "model.weights.h5" not in names:
                raise ArtifactError("not a Keras v3 file: config.json or model.weights.h5 missing "
                                    f"(holds {', '.join(sorted(names)[:5]) or 'nothing'})")
            config = json.loads(_member(archive, "config.json"))
            artifact = Artifact(path=path, kind="keras")
            info = archive.getinfo("model.weights.h5")
            if info.compress_type == zipfile.ZIP_STORED:
                with archive.open(info) as weights:  # seekable: h5py reads only what it needs
                    _read_weights(weights, artifact, config)
            else:
                _read_weights(io.BytesIO(_member(archive, "model.weights.h5")), artifact, config)
    except (zipfile.BadZipFile, zipfile.LargeZipFile) as exc:
        raise ArtifactError(f"not a Keras v3 file: {exc}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"corrupt .keras file: config.json is not JSON ({exc})") from exc
    except RecursionError:
        raise ArtifactError("corrupt .keras file: config.json is nested too deeply") from None
    return artifact


def _read_weights(source: Any, artifact: Artifact, config: Any) -> None:
    h5py = _h5py()
    try:
        with h5py.File(source, "r") as store:
            _keras3_layers(store, artifact, config)
    except (OSError, ValueError, TypeError, KeyError) as exc:  # h5py on a corrupt file
        raise ArtifactError(f"corrupt Keras weights (model.weights.h5): {exc}") from exc


def _keras3_layers(store: Any, artifact: Artifact, config: Any) -> None:
    """BN layers of a Keras 3 weights store (see the module docstring), and the optimizer's
    iteration count."""
    groups: list[Group] = []
    names: dict[str, str] = {}
    for h5path, name, roles in bn_paths(config):
        stored = [f"{h5path}/vars/{i}" for i in range(len(roles))]
        if all(key in store for key in stored):
            groups.append(Group(h5path, dict(zip(roles, stored))))
            names[h5path] = name
    claimed = {g.name for g in groups}
    for h5path, label, count in _stored_layers(store):
        if h5path in claimed or any(h5path.startswith(c + "/") for c in claimed):
            continue
        if count == 4:
            roles = ["gamma", "beta", "mean", "var"]
        else:  # 2: mean, var; 3: one of gamma/beta (which, only the config says), mean, var
            roles = [""] * (count - 2) + ["mean", "var"]
        keys = {role: f"{h5path}/vars/{i}" for i, role in enumerate(roles) if role}
        groups.append(Group(h5path, keys))
        names[h5path] = label
    artifact.layers = build_layers(groups, lambda key: store[key][()], "keras", names,
                                   shape_of=lambda key: _dataset_shape(store, key))
    if "optimizer/vars/0" in store:  # Keras 3 optimizers store `iterations` first
        _steps(artifact, _scalar(store, "optimizer/vars/0"), "optimizer iterations")


def _stored_layers(store: Any) -> list[tuple[str, str, int]]:
    """(h5 path, layer name, number of vars) of every stored BN-like layer outside the
    optimizer: a group with a `vars` subgroup of 2-4 datasets named like a BN class, or of
    exactly four equal-length vectors."""
    found: list[tuple[str, str, int]] = []

    def visit(name: str, obj: Any) -> None:
        if not name.endswith("/vars") or name.split("/")[0] == "optimizer" or \
                not hasattr(obj, "keys"):
            return
        datasets = [obj.get(str(i)) for i in range(len(obj))]
        if not datasets or any(getattr(d, "shape", None) is None for d in datasets):
            return
        shapes = [tuple(d.shape) for d in datasets]
        layer = name[: -len("/vars")]
        label = obj.attrs.get("name", layer.rpartition("/")[2])
        label = label.decode(errors="replace") if isinstance(label, bytes) else str(label)
        vectors = all(len(s) == 1 for s in shapes) and len(set(shapes)) == 1
        named_bn = bool(BN_STORED.match(layer.rpartition("/")[2]) or BN_STORED.match(label))
        if vectors and (len(shapes) == 4 or (named_bn and len(shapes) in (2, 3))):
            found.append((layer, label, len(shapes)))

    store.visititems(visit)
    return found


def _dataset_shape(store: Any, key: str) -> tuple[tuple[int, ...], int]:
    dataset = store[key]
    if not hasattr(dataset, "dtype"):
        raise ArtifactError(f"`{key}` is a group, not a weight")
    if dataset.shape is None:  # an HDF5 null dataspace
        return (0,), 1
    return tuple(int(d) for d in dataset.shape), int(dataset.dtype.itemsize)


def _scalar(store: Any, key: str) -> Any:
    if _dataset_shape(store, key)[0] != ():
        return None
    return store[key][()]


def read_h5(path: str) -> Artifact:
    """A Keras 3 weights file (`model.save_weights("m.weights.h5")`), or a legacy Keras HDF5
    model (`model.save("m.h5")`) or weights file, told apart by the legacy `weight_names`."""
    with open(path, "rb") as fh:
        if fh.read(8) != HDF5_MAGIC:
            raise ArtifactError("not an HDF5 file (no HDF5 signature)")
    h5py = _h5py()
    artifact = Artifact(path=path, kind="keras-h5")
    try:
        with h5py.File(path, "r") as store:
            root = store.get("model_weights", store)
            keys = _legacy_keys(root)
            if keys:
                artifact.layers = build_layers(
                    group_keys(keys), lambda key: store[keys[key]][()], "keras",
                    shape_of=lambda key: _dataset_shape(store, keys[key]))
                if "optimizer_weights" in store:
                    store["optimizer_weights"].visititems(
                        lambda name, obj: _h5_step(artifact, name, obj))
            elif _stored_layers(store) or "layers" in store or "vars" in store:
                artifact.kind = "keras-weights-h5"
                _keras3_layers(store, artifact, {})
            else:
                raise ArtifactError("no Keras weights in this HDF5 file (neither a Keras 3 "
                                    "weights file nor legacy `weight_names`)")
    except (OSError, KeyError, ValueError, TypeError) as exc:  # h5py: bad file / missing weight
        raise ArtifactError(f"corrupt HDF5 file: {exc}") from exc
    return artifact


def _legacy_keys(root: Any) -> dict[str, str]:
    """Weight name -> dataset path, from each layer group's `weight_names` attribute."""
    keys: dict[str, str] = {}
    for layer in root:
        try:
            names = root[layer].attrs.get("weight_names", [])
            names = [n.decode() if isinstance(n, bytes) else n for n in np.atleast_1d(names)]
        except (OSError, TypeError, ValueError, UnicodeDecodeError) as exc:
            raise ArtifactError(f"malformed `weight_names` attribute on `{layer}` "
                                f"({type(exc).__name__}: {exc})") from None
        for weight in names:
            if not isinstance(weight, str):
                raise ArtifactError(f"malformed `weight_names` attribute on `{layer}`: holds a "
                                    f"{type(weight).__name__}, not names")
            keys[weight] = f"{root.name}/{layer}/{weight}".lstrip("/")
    return keys


def _h5_step(artifact: Artifact, name: str, obj: Any) -> None:
    leaf = name.rsplit("/", 1)[-1].removesuffix(":0")
    if artifact.trained is None and leaf in STEP_NAMES and getattr(obj, "shape", None) == ():
        _steps(artifact, obj[()], "optimizer iterations")


def _steps(artifact: Artifact, value: Any, what: str) -> None:
    if value is None:
        return
    try:
        steps = int(np.asarray(value).reshape(()))
    except (TypeError, ValueError, OverflowError):
        return
    artifact.trained = steps > 0
    artifact.trained_evidence = f"{what} = {steps}"
