"""The monitors inside the processes that `bnfix doctor` starts.

`validate fix`'s probe boot (`bnfix/validate/probe_boot/sitecustomize.py`) loads
`bnfix.validate.probe_runtime`, which asks this module for its post-import hooks
(BNFIX_PROBE_HOOKS=bnfix.doctor.inject:hooks): when the script imports torch, every model that
contains BN gets a `bnfix.torch.monitor` at its first call; Keras' `Model.fit` gets a
`bnfix.keras.BNMonitor` callback; TF1's `Session.run` is watched by `bnfix.tf1.monitor`. The
user's script is not edited. Each process writes its recordings to `doctor-PID.json` (whole-file
renames) every few samples, when `--steps` stops the run, and at exit.
"""

from __future__ import annotations

import atexit
import os
import sys
import weakref
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from bnfix.doctor.record import Recording, write_recordings
from bnfix.validate.probe_runtime import ENV_DIR, ProbeLog

ENV_EVERY = "BNFIX_DOCTOR_EVERY"
ENV_STEPS = "BNFIX_DOCTOR_STEPS"
SAVE_EVERY = 20  # training steps between two writes of the recordings


class Monitor(Protocol):
    def snapshot(self) -> Recording: ...
    def close(self) -> Recording: ...


class Session:
    """This process's monitors, its training-step count and the `--steps` limit."""

    def __init__(self, log: ProbeLog) -> None:
        self.log = log
        self.path = Path(os.environ[ENV_DIR]) / f"doctor-{os.getpid()}.json"
        self.every = int(os.environ.get(ENV_EVERY, "10"))
        limit = os.environ.get(ENV_STEPS)
        self.limit = int(limit) if limit else None
        self.monitors: list[Monitor] = []
        self.steps = 0
        self.stopped = False
        self.closed = False

    def add(self, monitor: Monitor) -> None:
        self.monitors.append(monitor)

    def step(self) -> bool:
        """Count one training step; True when `--steps` says to stop now."""
        self.steps += 1
        if self.steps % SAVE_EVERY == 0:
            self.log.guard("doctor save", lambda: self.save(final=False))
        if self.limit is not None and self.steps >= self.limit and not self.stopped:
            self.stopped = True
            sys.stderr.write(f"bnfix doctor: stopping after {self.steps} training steps "
                             f"(--steps {self.limit})\n")
            return True
        return False

    def save(self, final: bool) -> None:
        if self.closed or not self.monitors:
            return
        recordings = []
        for monitor in self.monitors:
            recording = monitor.close() if final else monitor.snapshot()
            recording.stopped = self.stopped
            recordings.append(recording)
        self.closed = final
        names = [r.model for r in recordings]
        if len(set(names)) < len(names):  # two models of one class: tell them apart
            for index, recording in enumerate(recordings):
                recording.model = f"{recording.model}#{index}"
        write_recordings(self.path, recordings)


def hooks(log: ProbeLog) -> dict[str, Callable[[ModuleType], None]]:
    """The post-import hooks `probe_runtime` installs (BNFIX_PROBE_HOOKS)."""
    session = Session(log)
    atexit.register(lambda: log.guard("doctor exit", lambda: session.save(final=True)))
    return {
        "torch": lambda m: log.guard("doctor torch", lambda: _torch(m, session)),
        "keras": lambda m: log.guard("doctor keras", lambda: _keras(m, session)),
        "tensorflow": lambda m: log.guard("doctor tf1", lambda: _tf1(session)),
    }


def _torch(torch: ModuleType, session: Session) -> None:
    """A monitor for each model with BN, attached at its first call (the outermost module
    called: its pre-hook runs before its children's); DDP/DataParallel wrappers are looked
    through. Optimizer steps count the training steps."""
    import importlib

    from torch.nn.modules.batchnorm import _BatchNorm

    from bnfix.torch.monitor import TorchMonitor

    seen: weakref.WeakSet = weakref.WeakSet()
    covered: weakref.WeakSet = weakref.WeakSet()
    wrappers = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)

    def pre(module: Any, args: tuple) -> None:
        if module in seen:
            return
        seen.add(module)
        if module in covered:
            return
        model = module.module if isinstance(module, wrappers) else module
        if not any(isinstance(m, _BatchNorm) for m in model.modules()):
            return
        covered.update(module.modules())
        monitor = TorchMonitor(model, session.every).attach()
        session.add(monitor)
        if model is module:  # its own pre-hooks were collected before this global one ran
            monitor._root_pre(model, args)

    hooks = torch.nn.modules.module
    hooks.register_module_forward_pre_hook(
        lambda m, a: session.log.guard("doctor torch pre", lambda: pre(m, a)))
    optim = importlib.import_module("torch.optim.optimizer")

    def stepped(optimizer: Any, args: Any, kwargs: Any) -> None:
        if session.step():
            session.save(final=True)
            raise SystemExit(0)

    optim.register_optimizer_step_post_hook(stepped)


def _keras(keras: ModuleType, session: Session) -> None:
    """`Model.fit` gets a BNMonitor (the script's callback list is copied, not changed)."""
    from bnfix.keras.monitor import BNMonitor

    fit = keras.Model.fit

    def doctor_fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        if len(args) >= 6:  # callbacks given by position (x, y, batch_size, epochs, verbose, …)
            session.log.write("probe_error", where="doctor keras fit",
                              error="callbacks passed by position: fit not monitored")
            return fit(self, *args, **kwargs)
        monitor = BNMonitor(every=session.every, on_step=session.step)
        session.add(monitor)
        kwargs["callbacks"] = [*list(kwargs.get("callbacks") or []), monitor]
        return fit(self, *args, **kwargs)

    doctor_fit.__doc__ = fit.__doc__
    keras.Model.fit = doctor_fit


def _tf1(session: Session) -> None:
    """TF1 `Session.run` watched (Keras 3 programs never call it: nothing changes for them)."""
    from bnfix.tf1.monitor import watch_sessions

    def stepped() -> None:
        if session.step():
            session.save(final=True)
            raise SystemExit(0)

    watch_sessions(session.every, session.add, stepped, session.log.guard)
