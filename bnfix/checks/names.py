"""Naming conventions the rules rely on: what a function that evaluates a model is called, and
which modules are tests."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the engine imports this module on a warm run: no analysis records there
    from bnfix.ir import FunctionInfo, Mark

# Functions that evaluate a model: these exact names, or names with these prefixes/suffixes.
# Unit tests (`test_*`) are not evaluation code.
EVALUATION_NAMES = frozenset({
    "eval", "evaluate", "evaluation", "test", "predict", "infer", "inference", "serve",
    "validate", "validation", "val", "test_step", "test_epoch", "run_test", "test_model",
})
EVALUATION_PREFIXES = ("eval_", "evaluate_", "validate_", "validation_", "val_", "predict_",
                       "infer_", "inference_", "serve_", "serving_")
EVALUATION_SUFFIXES = ("_eval", "_evaluate", "_evaluation", "_validate", "_validation",
                       "_predict", "_inference", "_serving")


def is_evaluation(function: FunctionInfo | None) -> bool:
    """A function whose name says it evaluates a model (`validate`, `eval_step`, `test`)."""
    if function is None:
        return False
    name = function.name.lower().strip("_")
    return name in EVALUATION_NAMES or name.startswith(EVALUATION_PREFIXES) or \
        name.endswith(EVALUATION_SUFFIXES)


def is_test_module(path: str) -> bool:
    """`test_x.py`, `x_test.py`, `conftest.py` or anything under a `tests`/`testing` folder."""
    parts = path.replace("\\", "/").split("/")
    name = parts[-1]
    return name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py" or \
        any(part in ("tests", "test", "testing") for part in parts[:-1])


def telling_first(marks: list[Mark], neighbours: frozenset[str]) -> list[Mark]:
    """Marks in the order a message cites them: the file's own, then other files outside the
    tests, those of the modules the file calls or that call it first (a test's save/load round
    trip, or a script that never sees the model, is a poor example)."""
    return sorted(marks, key=lambda m: (m.path is not None,
                                        m.path is not None and is_test_module(m.path),
                                        m.path not in neighbours))
