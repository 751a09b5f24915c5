"""bnfix: find, fix, convert and validate BatchNorm bugs in TensorFlow, Keras and PyTorch code.

The lint path (`check_source`, `fix_source`, `check_paths`) needs only LibCST: TensorFlow,
PyTorch and ONNX are imported by their own front-ends, lazily. Attributes are loaded on first
use so that `import bnfix` (and the CLI's start-up) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "check_source": "bnfix.api",
    "fix_source": "bnfix.api",
    "check_paths": "bnfix.api",
    "FixResult": "bnfix.api",
    "Report": "bnfix.api",
    "Diagnostic": "bnfix.engine",
    "RuleBook": "bnfix.rulebook",
    "load_rulebook": "bnfix.rulebook",
}

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

if TYPE_CHECKING:
    from bnfix.api import FixResult, Report, check_paths, check_source, fix_source
    from bnfix.findings import Diagnostic
    from bnfix.rulebook import RuleBook, load_rulebook


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'bnfix' has no attribute {name!r}")
