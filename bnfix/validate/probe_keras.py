"""The Keras 3 probe: `Model.fit` gets one more callback (the script's own list is copied, not
changed) that records every BatchNormalization layer's settings when training starts and its
variables after each batch."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from bnfix.validate.probe_runtime import ProbeLog, values

STATS = ("gamma", "beta", "moving_mean", "moving_variance")


def _bn_layers(keras: ModuleType, model: Any) -> list[Any]:
    found = []
    stack = [model]
    while stack:
        layer = stack.pop()
        if isinstance(layer, keras.layers.BatchNormalization):
            found.append(layer)
        stack.extend(getattr(layer, "layers", []) or [])
    return found


def _state(layer: Any) -> dict[str, list[float]]:
    import numpy as np

    state = {}
    for name in STATS:
        variable = getattr(layer, name, None)
        if variable is not None:
            state[name] = values(np.asarray(variable.numpy()))
    return state


def install(keras: ModuleType, log: ProbeLog) -> None:
    class BNRecorder(keras.callbacks.Callback):
        """Records BN layers' settings at train begin and their variables after each batch."""

        def __init__(self) -> None:
            super().__init__()
            self.steps = 0

        def on_train_begin(self, logs: Any = None) -> None:
            log.guard("keras begin", self._begin)

        def _begin(self) -> None:
            strategy = getattr(self.model, "distribute_strategy", None)
            replicas = int(getattr(strategy, "num_replicas_in_sync", 1) or 1)
            layers = {layer.name: {"trainable": bool(layer.trainable),
                                   "synchronized": bool(getattr(layer, "synchronized", False)),
                                   "momentum": float(layer.momentum)}
                      for layer in _bn_layers(keras, self.model)}
            log.write("keras_fit", replicas=replicas, layers=layers)
            log.write("step", step=0, layers={layer.name: _state(layer)
                                              for layer in _bn_layers(keras, self.model)})

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.steps += 1
            if self.steps <= log.max_steps:
                log.guard("keras step", lambda: log.write(
                    "step", step=self.steps, layers={layer.name: _state(layer)
                                                     for layer in _bn_layers(keras, self.model)}))

    fit = keras.Model.fit

    def probed_fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        if len(args) >= 6:  # callbacks given by position (x, y, batch_size, epochs, verbose, …)
            log.write("probe_error", where="keras fit",
                      error="callbacks passed by position: fit not recorded")
            return fit(self, *args, **kwargs)
        callbacks = list(kwargs.get("callbacks") or [])
        recorder = log.guard("keras fit", BNRecorder)
        if recorder is not None:
            kwargs["callbacks"] = [*callbacks, recorder]
        return fit(self, *args, **kwargs)

    probed_fit.__doc__ = fit.__doc__
    keras.Model.fit = probed_fit
