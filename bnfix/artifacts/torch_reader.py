"""PyTorch checkpoints (`.pt/.pth/.bin/.ckpt`): state dicts, also nested in training checkpoints.

Loaded only with `torch.load(weights_only=True)`: a file that needs more than tensors and plain
containers is a pickled object whose loading runs code named by the file, so it is refused
unless the user passes `--allow-pickle`.
"""

from __future__ import annotations

import pickle
import re
import zipfile
from collections.abc import Mapping
from typing import Any

from bnfix.artifacts.grouping import build_layers, group_keys
from bnfix.artifacts.model import Artifact, ArtifactError, short_reason

ZIP_MAGIC = b"PK\x03\x04"
PICKLE_PROTO = 0x80  # pickle protocol >= 2 starts with the PROTO opcode (torch's legacy format)
# where training checkpoints keep the model's state dict, most specific first
NESTED = ("state_dict", "model_state_dict", "model", "module", "net", "network", "model_ema")
OPTIMIZER_KEYS = ("optimizer", "optimizer_state_dict", "optimizer_states", "optim", "opt")
STEP_KEYS = ("global_step", "step", "iteration", "iter", "epoch")
WRAPPER_PREFIXES = (("module.", "DDP/DataParallel"), ("_orig_mod.", "torch.compile"))


def sniff(head: bytes) -> bool:
    """Whether the first bytes look like something `torch.save` writes."""
    return head.startswith(ZIP_MAGIC) or (len(head) > 1 and head[0] == PICKLE_PROTO)


def read_torch(path: str, allow_pickle: bool = False) -> Artifact:
    with open(path, "rb") as fh:
        head = fh.read(8)
    if not sniff(head):
        raise ArtifactError(f"not a PyTorch checkpoint: neither a zip archive nor a pickle "
                            f"(starts with {head[:8]!r})")
    obj = _load(path, allow_pickle)
    artifact = Artifact(path=path, kind="torch-state-dict")
    state, where = _state_dict(obj, artifact)
    if where:
        artifact.notes.append(f"state dict under {where}")
    state = _strip_wrappers(state, artifact)
    groups = group_keys(state)
    artifact.layers = build_layers(groups, lambda key: _numpy(state[key]), "torch")
    _trained(obj, artifact)
    return artifact


def _load(path: str, allow_pickle: bool) -> Any:
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "Weights only load failed" not in str(exc):
            raise ArtifactError(f"corrupt pickle: {short_reason(exc)}") from exc
        if not allow_pickle:
            found = re.search(r"GLOBAL ([\w.]+)", str(exc))
            what = f" (it references `{found.group(1)}`)" if found else ""
            raise ArtifactError(
                f"refused: the file is a pickled Python object, not a plain state dict{what}; "
                "loading it executes code named by the file. Save `model.state_dict()` instead, "
                "or pass --allow-pickle if you trust the file") from exc
    except (RuntimeError, EOFError, ValueError, KeyError, zipfile.BadZipFile, OSError) as exc:
        raise ArtifactError(f"unreadable PyTorch checkpoint (truncated or corrupt?): "
                            f"{short_reason(exc)}") from exc
    try:  # --allow-pickle: the user vouched for the file
        return torch.load(path, map_location="cpu", weights_only=False)
    except (pickle.UnpicklingError, RuntimeError, EOFError, AttributeError, ImportError) as exc:
        raise ArtifactError(f"cannot unpickle: {short_reason(exc)}") from exc



def _is_state_dict(obj: Any) -> bool:
    import torch

    return isinstance(obj, Mapping) and any(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())


def _state_dict(obj: Any, artifact: Artifact) -> tuple[Mapping[str, Any], str]:
    """The model's state dict and where it was found (`''`: at the top)."""
    import torch

    if isinstance(obj, torch.nn.Module):  # a whole pickled model (--allow-pickle)
        artifact.kind = "torch-module"
        artifact.notes.append(f"pickled {type(obj).__name__} module")
        for name, module in obj.named_modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.training:
                artifact.notes.append(f"{name or type(obj).__name__} saved in train mode")
                break
        return obj.state_dict(), ""
    if _is_state_dict(obj):
        return obj, ""
    if isinstance(obj, Mapping):
        for key in NESTED:
            inner = obj.get(key)
            if isinstance(inner, torch.nn.Module):
                return inner.state_dict(), f"'{key}'"
            if _is_state_dict(inner):
                return inner, f"'{key}'"
        for key, inner in obj.items():
            if isinstance(key, str) and key not in OPTIMIZER_KEYS and _is_state_dict(inner):
                return inner, f"'{key}'"
        keys = ", ".join(repr(k) for k in list(obj)[:8])
        raise ArtifactError(f"no state dict in this checkpoint (top-level keys: {keys})")
    raise ArtifactError(f"no state dict in this file (it holds a {type(obj).__name__})")


def _strip_wrappers(state: Mapping[str, Any], artifact: Artifact) -> dict[str, Any]:
    """Drop the prefixes that wrappers add to every key (DDP's `module.`)."""
    out = dict(state)
    for prefix, wrapper in WRAPPER_PREFIXES:
        keys = [k for k in out if isinstance(k, str)]
        if keys and all(k.startswith(prefix) for k in keys):
            out = {k[len(prefix):]: v for k, v in out.items()}
            artifact.notes.append(f"`{prefix}` prefix stripped ({wrapper})")
            if prefix == "module.":
                artifact.distributed = True
    return out


def _numpy(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if value.is_floating_point():
            value = value.double()
        return value.numpy()
    return value


def _trained(obj: Any, artifact: Artifact) -> None:
    """Evidence of training: batches seen by BN, optimizer state, a step counter."""
    evidence: list[str] = []
    counts = [layer.num_batches_tracked for layer in artifact.layers
              if layer.num_batches_tracked is not None]
    if counts and max(counts) > 0:
        evidence.append(f"num_batches_tracked = {max(counts)}")
    if isinstance(obj, Mapping):
        for key in OPTIMIZER_KEYS:
            params = _optimizer_state_size(obj.get(key))
            if params:
                evidence.append(f"optimizer state for {params} parameters ('{key}')")
                break
        for key in STEP_KEYS:
            value = obj.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                evidence.append(f"{key} = {value}")
                break
    if evidence:
        artifact.trained, artifact.trained_evidence = True, "; ".join(evidence)
    elif counts:
        artifact.trained, artifact.trained_evidence = False, "num_batches_tracked = 0"


def _optimizer_state_size(value: Any) -> int:
    """Parameters with optimizer state (torch creates it on the first `step()`)."""
    if isinstance(value, list | tuple):  # Lightning: one state dict per optimizer
        return sum(_optimizer_state_size(v) for v in value)
    if isinstance(value, Mapping) and isinstance(value.get("state"), Mapping):
        return len(value["state"])
    return 0
