"""The project's summaries by module, kept as their cached JSON text until one is asked for,
and what a warm run reads of them without building them: their digests and outlines. The
summary records (`summary.py`) are imported only when a summary is built or parsed."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bnfix.project.summary import Loc, ModuleSummary


class SummaryStore(Mapping[str, "ModuleSummary"]):
    """Summaries by module id, kept as their JSON text until one is asked for (a warm run
    reads the cache without converting summaries it never consults). Iterated in module
    order, whichever came from the cache and whichever from the files (and in what order the
    workers sent them): what the index derives from the order is the same on every run."""

    def __init__(self) -> None:
        self._objects: dict[str, ModuleSummary] = {}
        self._texts: dict[str, str] = {}
        self.digests: dict[str, str] = {}
        self._order: list[str] | None = None

    def add(self, summary: ModuleSummary) -> None:
        self._objects[summary.module] = summary
        self._texts.pop(summary.module, None)
        self.digests[summary.module] = summary.digest
        self._order = None

    def add_text(self, module: str, text: str, digest: str) -> None:
        self._texts[module] = text
        self._objects.pop(module, None)
        self.digests[module] = digest
        self._order = None

    def __getitem__(self, module: str) -> ModuleSummary:
        found = self._objects.get(module)
        if found is not None:
            return found
        from bnfix.project.summary import ModuleSummary

        text = self._texts.pop(module)  # KeyError when unknown
        try:
            summary = ModuleSummary.from_data(json.loads(text))
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            self._order = None
            raise KeyError(module) from exc  # a corrupt cached summary: as if absent
        self._objects[module] = summary
        return summary

    def get(self, module: str, default: Any = None) -> Any:  # type: ignore[override]
        try:
            return self[module]
        except KeyError:
            self.digests.pop(module, None)
            return default

    def outline(self, module: str) -> Outline | None:
        """The module's `outline`, read from its JSON text when the summary was not built
        (every module's marks are wanted; building every summary for them cost more)."""
        found = self._objects.get(module)
        if found is not None:
            return outline(found)
        text = self._texts.get(module)
        if text is None:
            return None
        try:
            data = json.loads(text)
            return (data["path"], tuple((k, tuple(lc), f) for k, lc, f in data["marks"]),
                    frozenset(b[0] for item in data["functions"] for b in item[5]))
        except (ValueError, KeyError, TypeError, IndexError):
            return outline(self.get(module))  # corrupt: as absent, as `get` makes it

    def __contains__(self, module: object) -> bool:
        return module in self._objects or module in self._texts

    def __iter__(self) -> Iterator[str]:
        if self._order is None:
            self._order = sorted({*self._objects, *self._texts})
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._objects) + len(self._texts)

    def texts(self) -> dict[str, str]:
        """Every summary as JSON text (what another process rebuilds the store from)."""
        out = dict(self._texts)
        out.update((name, summary_text(s)) for name, s in self._objects.items())
        return out

    @staticmethod
    def from_texts(texts: dict[str, str], digests: dict[str, str]) -> SummaryStore:
        store = SummaryStore()
        for name, text in texts.items():
            store.add_text(name, text, digests.get(name, ""))
        return store


# a summary's file, marks (kind, where, function) and the BN APIs its functions build
Outline = tuple[str, tuple[tuple[str, "Loc", "str | None"], ...], frozenset[str]]


def outline(summary: ModuleSummary | None) -> Outline | None:
    if summary is None:
        return None
    return (summary.path, summary.marks,
            frozenset(b.api for f in summary.functions.values() for b in f.bn))


def outline_digest(found: Outline | None) -> str:
    """A digest of what every file's check reads of this module whatever it imports: its
    marks (kind, place, function) and the BN APIs it builds (see ProjectIndex.project_marks)."""
    if found is None or not (found[1] or found[2]):
        return ""  # nothing for other files to read
    path, marks, apis = found
    text = json.dumps([path, [[k, list(lc), f] for k, lc, f in marks], sorted(apis)],
                      separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def resolution_face(text: str) -> tuple[str, dict[str, str | None]] | None:
    """What resolving a name through a module reads of its summary (`ProjectIndex._in_module`:
    its file, imports, star imports, and its classes' names, bases and methods) as one text,
    and its functions (qualname: class); None when the summary's JSON text is corrupt."""
    try:
        data = json.loads(text)
        face = json.dumps([data["path"], data["imports"], data["star"],
                           [[c[0], c[2], c[3]] for c in data["classes"]]])
        return face, {item[0]: item[2] for item in data["functions"]}
    except (ValueError, KeyError, TypeError, IndexError):
        return None


def added_functions(before: str, after: str) -> list[str] | None:
    """The functions a summary's JSON text `after` adds to `before` (qualnames), when that is
    all it changes and nothing else in the module names them (so the module's other calls
    resolve, and its other functions reach, as before); None otherwise (a function removed
    or changed, anything else changed, a corrupt text)."""
    try:
        old, new = json.loads(before), json.loads(after)
        old_functions = {item[0]: item for item in old.pop("functions")}
        new_functions = {item[0]: item for item in new.pop("functions")}
        old.pop("digest")
        new.pop("digest")
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None
    added = sorted(new_functions.keys() - old_functions.keys())
    if old != new or any(new_functions.get(q) != item for q, item in old_functions.items()):
        return None
    rest = json.dumps([old, list(old_functions.values())])
    return None if any(name in rest for name in called_by(added)) else added


def called_by(qualnames: Iterable[str]) -> set[str]:
    """The names a call of these functions can be written with: each part of their qualnames."""
    return {part for q in qualnames for part in q.split(".") if part != "<locals>"}


def summary_text(summary: ModuleSummary) -> str:
    return json.dumps(summary.to_data(), separators=(",", ":"))
