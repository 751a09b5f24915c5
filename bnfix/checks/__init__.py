"""Rule logic over the IR. Each check is registered under its rule code; its documentation
and examples are the rule's data file in `rules/`. Checks read only the IR."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the lifted module's records are imported when a file is lifted, not before
    from bnfix.ir import Finding, ModuleIR

Check = Callable[["ModuleIR"], Iterable["Finding"]]

REGISTRY: dict[str, Check] = {}
# Codes the engine itself reports (a file that cannot be read or parsed).
ENGINE_CODES = frozenset({"BN900", "BN901"})


def check(code: str) -> Callable[[Check], Check]:
    def register(fn: Check) -> Check:
        if code in REGISTRY:
            raise ValueError(f"two checks registered for {code}")
        REGISTRY[code] = fn
        return fn

    return register


def registry() -> dict[str, Check]:
    """All checks, importing the framework groups on first use."""
    from bnfix.checks import distributed, keras, migration, tensorflow, torch  # noqa: F401  (they register)

    return REGISTRY
