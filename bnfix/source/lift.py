"""Lifting Python source into the IR: one `ast` walk (`walk.py`) records what the rules can
need, then resolution (`resolve.py`) turns it into BN sites and their TF1 context. Rules never
see the tree."""

from __future__ import annotations

import ast

from bnfix.ir import ModuleIR
from bnfix.rulebook import Catalogue
from bnfix.source.resolve import Resolver
from bnfix.source.text import SourceText
from bnfix.source.walk import Walker


def lift(text: SourceText, tree: ast.Module, path: str, catalogue: Catalogue) -> ModuleIR:
    return Resolver(Walker(text, tree, catalogue).walk(), path).resolve()
