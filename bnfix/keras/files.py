"""`bnfix convert MODEL.keras --to sync|plain -o OUT.keras`: load safely, convert, check, write.

The check: the written file is loaded back; its BN flags must be the converted ones and its
eval-mode outputs on a random batch must equal the original's (BN in inference mode does not
depend on `synchronized`, so any difference is a lost weight). The output appears only after the
check passed (`bnfix.convert.atomic_output`). A model without BN is an error, and so is one
with a BN layer the conversion refused: nothing is written, so a pipeline cannot mistake a copy
for a conversion. A compiled model keeps its optimizer state (iteration count, momenta):
`bnfix inspect` reads the iteration count as the evidence that a checkpoint was trained.
"""

from __future__ import annotations

import os
import zipfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is first imported

import keras
import numpy as np

from bnfix.artifacts.limits import check_keras_archive as check_archive
from bnfix.artifacts.model import ArtifactError
from bnfix.convert import ConversionError, atomic_output
from bnfix.keras.convert import ConversionRefused, convert_sync, layer_paths, revert_sync
from bnfix.keras.report import ConversionReport

TOLERANCE = 1e-6  # relative to the largest output magnitude (at least 1)


def convert_keras_file(path: str, to: str, output: str) -> str:
    """Convert the model in `path` (`to`: "sync" or "plain") into `output`; the summary."""
    if to not in ("sync", "plain"):
        raise ConversionError(f"--to {to}: a .keras model converts to sync or plain")
    if not output.endswith(".keras"):
        raise ConversionError(f"{output}: the output must be a .keras file")
    original = _load(path)
    convert = convert_sync if to == "sync" else revert_sync
    report = ConversionReport()
    try:
        converted = convert(original, report=report)
    except ConversionRefused as exc:
        raise ConversionError(f"refused: {exc}") from exc
    if report.bn_layers == 0:
        raise ConversionError("no BatchNormalization layer in the model: nothing to convert, "
                              "nothing written")
    if report.refused:
        reasons = "; ".join(f"{r.path}: {r.reason}" for r in report.refused)
        raise ConversionError(f"refused, nothing written: {reasons}")
    # an in-place conversion changed `original`: compare with a fresh load
    reference = _load(path) if report.in_place else original
    error = _write_checked(converted, report, reference, output)
    return (f"{report.table()}\nCheck: the written model's eval-mode outputs equal the "
            f"original's on a random batch (max abs error {error:.3g}, tolerance "
            f"{TOLERANCE:g}).\nWrote {output}")


def _load(path: str) -> keras.Model:
    if not zipfile.is_zipfile(path):
        raise ConversionError("not a .keras file (a .keras model is a zip archive): corrupt or "
                              "another format")
    try:
        check_archive(path)
    except ArtifactError as exc:
        raise ConversionError(str(exc)) from None
    try:
        return keras.saving.load_model(path, compile=True, safe_mode=True)
    except Exception as exc:  # whatever the file makes Keras raise: one line for the user
        detail = str(exc).strip().splitlines()
        raise ConversionError(f"cannot load the Keras model: {type(exc).__name__}: "
                              f"{detail[0] if detail else 'no detail'}") from exc


def _write_checked(model: keras.Model, report: ConversionReport, reference: keras.Model,
                   output: str) -> float:
    with atomic_output(output, suffix=".keras") as temporary:
        model.save(temporary)
        written = _load(str(temporary))
        flags = {p: layer.synchronized for p, layer in layer_paths(written).items()
                 if isinstance(layer, keras.layers.BatchNormalization)}
        lost = [c.path for c in report.converted if flags.get(c.path) != c.after]
        if lost:
            raise ConversionError(f"synchronized={report.synchronized} did not survive "
                                  f"saving for {', '.join(lost)} (set in place on a layer whose "
                                  "config does not carry it): nothing written")
        error = _max_output_error(reference, written)
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
