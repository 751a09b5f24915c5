"""bnfix: find, fix, convert and validate BatchNorm bugs in TensorFlow, Keras and PyTorch code.

The lint path (`check_source`, `fix_source`, `check_paths`) needs only LibCST: TensorFlow,
PyTorch and ONNX are imported by their own front-ends, lazily."""

from __future__ import annotations

__version__ = "0.1.0"

from bnfix.api import FixResult, Report, check_paths, check_source, fix_source  # noqa: E402
from bnfix.engine import Diagnostic  # noqa: E402
from bnfix.rulebook import RuleBook, load_rulebook  # noqa: E402

__all__ = [
    "Diagnostic",
    "FixResult",
    "Report",
    "RuleBook",
    "__version__",
    "check_paths",
    "check_source",
    "fix_source",
    "load_rulebook",
]
