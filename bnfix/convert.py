"""`bnfix convert`: picks the model front-end by file type; each front-end checks its rewrite
before anything is written."""

from __future__ import annotations

import sys
from pathlib import Path

TARGETS = {".keras": ("sync", "plain", "groupnorm"), ".onnx": ("inference", "folded")}


class ConversionError(Exception):
    """A conversion refused or failed its check: one line for the user, nothing written."""


def convert_file(model: str, to: str, output: str, groups: int = 32) -> int:
    """Convert MODEL to OUTPUT; print what was converted. Exit code as the CLI's."""
    suffix = Path(model).suffix.lower()
    if suffix not in TARGETS:
        sys.stderr.write(f"bnfix: {model}: unsupported model type `{suffix or '(none)'}`: "
                         "convert reads .keras and .onnx files\n")
        return 2
    if to not in TARGETS[suffix]:
        sys.stderr.write(f"bnfix: {model}: --to {to} does not apply to {suffix} files "
                         f"(use {' or '.join(TARGETS[suffix])})\n")
        return 2
    if not Path(model).is_file():
        sys.stderr.write(f"bnfix: {model}: no such file\n")
        return 2
    try:
        if suffix == ".keras" and to == "groupnorm":
            from bnfix.keras.groupnorm import convert_keras_file as to_groupnorm

            summary = to_groupnorm(model, output, groups)
        elif suffix == ".keras":
            from bnfix.keras.files import convert_keras_file

            summary = convert_keras_file(model, to, output)
        else:
            from bnfix.onnx.rewrite import convert_onnx_file

            summary = convert_onnx_file(model, to, output)
    except ConversionError as exc:
        sys.stderr.write(f"bnfix: {model}: {exc}\n")
        return 1
    sys.stdout.write(summary if summary.endswith("\n") else summary + "\n")
    return 0
