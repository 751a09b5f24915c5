"""`bnfix convert MODEL.keras --to sync|plain -o OUT.keras`: load safely, convert, check, write.

The check: the written file is loaded back; its BN flags must be the converted ones and its
eval-mode outputs on a random batch must equal the original's (BN in inference mode does not
depend on `synchronized`, so any difference is a lost weight). The output appears only after the
check passed (temporary file in the output's folder, then `os.replace`). A model without BN is an
error: nothing is written, so a pipeline cannot mistake a copy for a conversion.
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is first imported

import keras
import numpy as np

from bnfix.convert import ConversionError
from bnfix.keras.convert import (
    ConversionRefused,
    KerasConversion,
    convert_sync,
    layer_paths,
    revert_sync,
)

TOLERANCE = 1e-6  # relative to the largest output magnitude (at least 1)


def convert_keras_file(path: str, to: str, output: str) -> str:
    """Convert the model in `path` (`to`: "sync" or "plain") into `output`; the summary."""
    if to not in ("sync", "plain"):
        raise ConversionError(f"--to {to}: a .keras model converts to sync or plain")
    if not output.endswith(".keras"):
        raise ConversionError(f"{output}: the output must be a .keras file")
    original = _load(path)
    convert = convert_sync if to == "sync" else revert_sync
    try:
        conversion = convert(original)
    except ConversionRefused as exc:
        raise ConversionError(f"refused: {exc}") from exc
    report = conversion.report
    if report.bn_layers == 0:
        raise ConversionError("no BatchNormalization layer in the model: nothing to convert, "
                              "nothing written")
    if report.refused:
        reasons = "; ".join(f"{r.path}: {r.reason}" for r in report.refused)
        raise ConversionError(f"refused, nothing written: {reasons}")
    # an in-place conversion changed `original`: compare with a fresh load
    reference = _load(path) if report.in_place else original
    error = _write_checked(conversion, reference, output)
    return (f"{report.table()}\nCheck: the written model's eval-mode outputs equal the "
            f"original's on a random batch (max abs error {error:.3g}, tolerance "
            f"{TOLERANCE:g}).\nWrote {output}")


def _load(path: str) -> keras.Model:
    if not zipfile.is_zipfile(path):
        raise ConversionError("not a .keras file (a .keras model is a zip archive): corrupt or "
                              "another format")
    try:
        return keras.saving.load_model(path, compile=True, safe_mode=True)
    except Exception as exc:  # whatever the file makes Keras raise: one line for the user
        detail = str(exc).strip().splitlines()
        raise ConversionError(f"cannot load the Keras model: {type(exc).__name__}: "
                              f"{detail[0] if detail else 'no detail'}") from exc


def _write_checked(conversion: KerasConversion, reference: keras.Model, output: str) -> float:
    folder = Path(output).resolve().parent
    handle, temporary = tempfile.mkstemp(suffix=".keras", dir=folder, prefix=".bnfix-")
    os.close(handle)
    try:
        conversion.model.save(temporary)
        written = _load(temporary)
        flags = {p: layer.synchronized for p, layer in layer_paths(written).items()
                 if isinstance(layer, keras.layers.BatchNormalization)}
        lost = [c.path for c in conversion.report.converted if flags.get(c.path) != c.after]
        if lost:
            raise ConversionError(f"synchronized={conversion.report.synchronized} did not survive "
                                  f"saving for {', '.join(lost)} (set in place on a layer whose "
                                  "config does not carry it): nothing written")
        error = _max_output_error(reference, written)
        os.replace(temporary, output)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return error


def _max_output_error(reference: keras.Model, candidate: keras.Model) -> float:
    inputs = getattr(reference, "inputs", None)
    if not inputs:
        raise ConversionError("the model has no known input shape, so the conversion cannot be "
                              "checked: nothing written")
    rng = np.random.default_rng(0)
    batch = []
    for spec in inputs:
        shape = [2 if d is None else d for d in spec.shape]
        if "int" in str(spec.dtype):
            batch.append(np.zeros(shape, dtype=str(spec.dtype)))
        else:
            batch.append(rng.normal(size=shape).astype(str(spec.dtype)))
    feed = batch[0] if len(batch) == 1 else batch
    expected = keras.tree.flatten(reference(feed, training=False))
    got = keras.tree.flatten(candidate(feed, training=False))
    error = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                for a, b in zip(expected, got, strict=True))
    scale = max(1.0, *(float(np.max(np.abs(np.asarray(a)))) for a in expected))
    if not error <= TOLERANCE * scale:
        raise ConversionError(f"check failed: eval-mode outputs differ by {error:.3g} "
                              f"(tolerance {TOLERANCE * scale:.3g}): nothing written")
    return error
