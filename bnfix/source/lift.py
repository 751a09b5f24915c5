"""Lifting Python source into the IR: one `ast` walk (`walk.py`) records what the rules can
need, then resolution (`resolve.py`) turns it into BN sites and their TF1 context. Rules never
see the tree."""

from __future__ import annotations

import ast

from bnfix.ir import ModuleIR
from bnfix.rulebook import Catalogue
from bnfix.source.imports import ModuleContext
from bnfix.source.resolve import Resolver
from bnfix.source.text import SourceText
from bnfix.source.walk import Walker


def lift(text: SourceText, tree: ast.Module, path: str, catalogue: Catalogue,
         context: ModuleContext | None = None) -> ModuleIR:
    return lift_with_resolver(text, tree, path, catalogue, context)[1]


def lift_with_resolver(text: SourceText, tree: ast.Module, path: str, catalogue: Catalogue,
                       context: ModuleContext | None = None) -> tuple[Resolver, ModuleIR]:
    """The IR and the resolver that made it (the project view and the summary read the
    resolver's records: the module is not walked again)."""
    resolver = Resolver(Walker(text, tree, catalogue, context).walk(), path)
    return resolver, resolver.resolve()
