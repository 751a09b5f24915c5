"""The probe inside the user's processes: an event log (JSON lines, one file per process) and
post-import hooks that install the framework probes when the script imports torch, TensorFlow or
Keras. Loaded by probe_boot/sitecustomize.py; imports no framework itself."""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

ENV_DIR = "BNFIX_PROBE_DIR"  # where the logs go (set by `bnfix validate fix`)
ENV_ROOT = "BNFIX_PROBE_ROOT"  # the project copy the command runs in
ENV_STEPS = "BNFIX_PROBE_STEPS"  # training steps recorded in full (then only counters)
# "module:function" returning the post-import hooks to install (`bnfix doctor` sets it to its
# monitors); unset: `validate fix`'s probes
ENV_HOOKS = "BNFIX_PROBE_HOOKS"
DEFAULT_STEPS = 50
MAX_CHANNELS = 256  # values recorded per BN variable (the first channels)


class ProbeLog:
    """Appends events to `probe-PID.jsonl`; a rank getter tags them in distributed runs."""

    def __init__(self, folder: str) -> None:
        self.path = os.path.join(folder, f"probe-{os.getpid()}.jsonl")
        self.lock = threading.Lock()
        self.rank: Callable[[], int | None] = _env_rank
        self.max_steps = int(os.environ.get(ENV_STEPS, DEFAULT_STEPS))
        self.root = os.environ.get(ENV_ROOT, "")

    def write(self, kind: str, **fields: Any) -> None:
        event = {"kind": kind, "pid": os.getpid(), "rank": self.rank(), "t": time.time(), **fields}
        line = json.dumps(event, default=_jsonable) + "\n"
        with self.lock, open(self.path, "a", encoding="utf-8") as out:
            out.write(line)

    def failed(self, where: str, exc: BaseException) -> None:
        """A probe failure: recorded (the report says "probe failed"), never raised into the
        user's script."""
        self.write("probe_error", where=where, error=f"{type(exc).__name__}: {exc}",
                   traceback=traceback.format_exc(limit=6))

    def guard(self, where: str, action: Callable[[], Any]) -> Any:
        try:
            return action()
        except Exception as exc:  # noqa: BLE001 - logged, the user's script must go on
            self.failed(where, exc)
            return None

    def project_files(self) -> list[str]:
        """Source files of the project copy loaded in this process (which findings ran)."""
        files = {getattr(m, "__file__", None) for m in list(sys.modules.values())}
        if sys.argv and sys.argv[0]:
            files.add(os.path.abspath(sys.argv[0]))
        root = os.path.join(self.root, "")
        return sorted(os.path.relpath(f, self.root) for f in files
                      if isinstance(f, str) and self.root and os.path.abspath(f).startswith(root))


def _env_rank() -> int | None:
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return None


def _jsonable(value: Any) -> Any:
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()
    return repr(value)


def values(array: Any) -> list[float]:
    """A BN variable's first MAX_CHANNELS values as floats (numpy arrays or tensors)."""
    flat = array.reshape(-1)[:MAX_CHANNELS]
    return [float(v) for v in flat.tolist()]


class _HookedLoader(importlib.abc.Loader):
    """Runs a module as its own loader would, then the probe's hook on it."""

    def __init__(self, loader: importlib.abc.Loader, hook: Callable[[ModuleType], None]) -> None:
        self.loader = loader
        self.hook = hook

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.hook(module)


class PostImportHooks(importlib.abc.MetaPathFinder):
    """Calls hook(module) once `name` has been imported (the standard post-import pattern:
    the spec comes from the other finders, its loader is wrapped)."""

    def __init__(self, hooks: dict[str, Callable[[ModuleType], None]]) -> None:
        self.hooks = dict(hooks)

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        # the hook is consumed when the module runs, not here: `importlib.util.find_spec`
        # (TensorFlow asks it about keras) looks a module up without importing it
        if name not in self.hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _HookedLoader(spec.loader, lambda m: self._imported(name, m))
                return spec
        return None

    def _imported(self, name: str, module: ModuleType) -> None:
        hook = self.hooks.pop(name, None)
        if hook is not None:
            hook(module)


LOG: ProbeLog | None = None


def boot() -> None:
    """Install the hooks (and run them at once for a framework already imported)."""
    global LOG
    folder = os.environ.get(ENV_DIR)
    if not folder or LOG is not None:
        return
    log = LOG = ProbeLog(folder)
    log.guard("boot", lambda: _install(log))


def _install(log: ProbeLog) -> None:
    hooks = _hooks(log)
    for name in [n for n in hooks if n in sys.modules]:
        hooks.pop(name)(sys.modules[name])
    sys.meta_path.insert(0, PostImportHooks(hooks))
    log.write("start", argv=list(sys.argv), executable=sys.executable)
    atexit.register(lambda: log.guard("exit", lambda: log.write("files",
                                                                files=log.project_files())))


def _hooks(log: ProbeLog) -> dict[str, Callable[[ModuleType], None]]:
    """The hooks named by BNFIX_PROBE_HOOKS, else validate's probes."""
    target = os.environ.get(ENV_HOOKS)
    if target:
        import importlib

        module, _, function = target.partition(":")
        return getattr(importlib.import_module(module), function)(log)
    return _probe_hooks(log)


def _probe_hooks(log: ProbeLog) -> dict[str, Callable[[ModuleType], None]]:
    from bnfix.validate import probe_keras, probe_tf1, probe_torch

    return {
        "torch": lambda m: log.guard("torch", lambda: probe_torch.install(m, log)),
        "tensorflow": lambda m: log.guard("tensorflow", lambda: probe_tf1.install_session(m, log)),
        probe_tf1.LEGACY_LAYERS: lambda m: log.guard("tf1 layers",
                                                     lambda: probe_tf1.install_layers(m, log)),
        "keras": lambda m: log.guard("keras", lambda: probe_keras.install(m, log)),
    }
