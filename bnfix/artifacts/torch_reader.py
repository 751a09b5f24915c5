"""PyTorch checkpoints (`.pt/.pth/.bin/.ckpt`): state dicts, also nested in training checkpoints.

Loaded only with `torch.load(weights_only=True)`: a file that needs more than tensors and plain
containers is a pickled object whose loading runs code named by the file, so it is refused
unless the user passes `--allow-pickle`.

Before torch reads anything, the sizes the file declares are checked against the file and the
budget (`bnfix.artifacts.limits`): a zip checkpoint's compressed members (torch never writes
compressed ones; a forged 3 MB file can inflate to gigabytes) and its pickle; a legacy
checkpoint's storages (their sizes are in its pickle, read here by an unpickler that builds
nothing). Zip checkpoints are memory-mapped (unless a member is compressed), so only the
tensors read (the BN ones) are paged in.
"""

from __future__ import annotations

import os
import pickle
import re
import zipfile
from collections.abc import Mapping
from typing import Any

from bnfix.artifacts.grouping import build_layers, group_keys, moved_affine
from bnfix.artifacts.limits import budget, check, human
from bnfix.artifacts.model import Artifact, ArtifactError, short_reason

ZIP_MAGIC = b"PK\x03\x04"
PICKLE_PROTO = 0x80  # pickle protocol >= 2 starts with the PROTO opcode (torch's legacy format)
LEGACY_MAGIC = b"\x80\x02\x8a\x0a"  # PROTO 2, LONG1 of 10 bytes: torch's MAGIC_NUMBER
# where training checkpoints keep the model's state dict, most specific first
NESTED = ("state_dict", "model_state_dict", "model", "module", "net", "network", "model_ema")
OPTIMIZER_KEYS = ("optimizer", "optimizer_state_dict", "optimizer_states", "optim", "opt")
STEP_KEYS = ("global_step", "step", "iteration", "iter", "epoch")
WRAPPER_PREFIXES = (("module.", "DDP/DataParallel"), ("_orig_mod.", "torch.compile"))


def sniff(head: bytes) -> bool:
    """Whether the first bytes look like something `torch.save` writes."""
    return head.startswith(ZIP_MAGIC) or (len(head) > 1 and head[0] == PICKLE_PROTO)


def sniff_strict(head: bytes) -> bool:
    """What only torch writes: a zip archive, or the legacy format's first pickle (protocol 2,
    then the magic number as a 10-byte long). Raw tensor bytes start with 0x80 one time in 256."""
    return head.startswith((ZIP_MAGIC, LEGACY_MAGIC))


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
    groups = group_keys(k for k in state if isinstance(k, str))
    artifact.layers = build_layers(groups, lambda key: _numpy(state[key]), "torch",
                                   shape_of=lambda key: _shape(state[key]))
    _trained(obj, artifact)
    return artifact


def _shape(value: Any) -> tuple[tuple[int, ...], int]:
    import torch

    if isinstance(value, torch.Tensor):
        return tuple(value.shape), value.element_size()
    return (), 8


def check_declared_sizes(path: str) -> bool:
    """Refuse (ArtifactError) what would make torch allocate more than the file holds or the
    budget allows. True when the file can be memory-mapped: a zip checkpoint whose members are
    all stored (torch maps a compressed member's bytes as they are: garbage)."""
    size = os.path.getsize(path)
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except zipfile.BadZipFile:
        _check_legacy(path, size)
        return False
    inflated = 0
    for info in members:
        if info.compress_type != zipfile.ZIP_STORED or info.filename.endswith(".pkl"):
            check(f"zip member `{info.filename}`", info.file_size)
        if info.compress_type != zipfile.ZIP_STORED:
            inflated += info.file_size
    if inflated > budget():
        raise ArtifactError(f"its compressed members inflate to {human(inflated)} in all, over "
                            f"the {human(budget())} limit (--max-tensor-bytes): refused before "
                            "reading them")
    return inflated == 0 and all(i.compress_type == zipfile.ZIP_STORED for i in members)


class _Anything:
    """What the size scan builds for every global a pickle names: nothing runs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.name = ""

    def __call__(self, *args: Any, **kwargs: Any) -> _Anything:
        return _Anything()

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def append(self, value: Any) -> None:
        pass

    def extend(self, values: Any) -> None:
        pass


def _global(module: str, name: str) -> _Anything:
    found = _Anything()
    found.name = name
    return found


_STORAGE_BYTES = {"DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2,
                  "LongStorage": 8, "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1,
                  "ByteStorage": 1, "BoolStorage": 1, "ComplexFloatStorage": 8,
                  "ComplexDoubleStorage": 16}


class _SizeScan(pickle.Unpickler):
    """Reads a legacy checkpoint's pickles for the storages they declare, building nothing."""

    def __init__(self, fh: Any) -> None:
        super().__init__(fh)
        self.declared: dict[Any, int] = {}

    def find_class(self, module: str, name: str) -> Any:
        return _global(module, name)

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] in ("storage", b"storage"):
            kind, key, numel = pid[1], pid[2], pid[4]
            width = _STORAGE_BYTES.get(getattr(kind, "name", ""), 1)
            if isinstance(numel, int) and isinstance(key, str | bytes | int):
                self.declared[key] = numel * width
        return _Anything()


def _check_legacy(path: str, size: int) -> None:
    """torch's pre-1.6 format: four pickles (magic number, protocol, system info, the object),
    then the storages, allocated at the sizes the object pickle declares."""
    with open(path, "rb") as fh:
        try:
            for _ in range(3):
                _SizeScan(fh).load()
            scan = _SizeScan(fh)
            scan.load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
                IndexError, KeyError, RecursionError, MemoryError, OverflowError):
            return  # not a legacy checkpoint: torch.load says what it is
    for key, declared in scan.declared.items():
        check(f"storage `{key}`", declared, size)
    check("its storages", sum(scan.declared.values()), size)


def _load(path: str, allow_pickle: bool) -> Any:
    import torch

    mmap = check_declared_sizes(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
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
        return torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
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
    if counts and not evidence:
        # BN in eval mode all along (num_batches_tracked = 0) while the optimizer moved gamma/beta
        moved = moved_affine(artifact.layers)
        if moved:
            evidence.append(f"{moved} while num_batches_tracked = 0")
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
