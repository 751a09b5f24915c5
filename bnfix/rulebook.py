"""The rule book and the BN API catalogue, loaded from the TOML files in `rules/`.

Rules are data: code, name, documentation and examples live in `rules/BNxxx.toml`; the logic
that decides a finding lives in `bnfix.checks`. The catalogue (`rules/catalogue/*.toml`) says
which qualified names are BatchNorm APIs and how their arguments map onto bnfix's vocabulary,
so supporting a new BN API is an edit of data, not of code.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any, NamedTuple

DOCS_URL = "https://github.com/bnfix/bnfix/blob/main/rules/{code}.toml"
FIX_KINDS = ("safe", "mixed", "unsafe", "display-only", "none")
EXAMPLE_KINDS = ("valid", "invalid", "fix")
# What a rule reads: Python source (`bnfix check`), artifacts (`bnfix inspect`: checkpoints,
# graphs, model files) or a training run (`bnfix doctor`: what the BN monitors recorded).
# Artifact rules' examples are artifacts, runtime rules' examples recordings, not source.
TARGETS = ("source", "artifact", "runtime")
COMMANDS = {"source": "bnfix check", "artifact": "bnfix inspect", "runtime": "bnfix doctor"}


class Migration(NamedTuple):
    """How to replace a deprecated BN API (catalogue data, read by rule BN007)."""

    to: str
    why: str
    rename: dict[str, str]
    defaults: dict[str, str]
    values: dict[str, dict[str, str]]
    split: dict[str, dict[str, str]]
    refuse: dict[str, str]
    written: tuple[str, ...] = ()
    since: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()  # the version without the old API (empty: it still runs)
    positional: int = 0
    require_str: tuple[str, ...] = ()
    keep_unknown: bool = False
    add: tuple[str, ...] = ()
    display_only: bool = False
    # keywords that make the rewrite exact when the call passes them (not None): the fix is
    # safe then, unsafe otherwise; empty: the rewrite is never exact (always unsafe)
    safe_when: tuple[str, ...] = ()


class ApiRef(NamedTuple):
    """What rules need from a catalogue entry (kept small so the IR stays front-end neutral)."""

    id: str
    framework: str
    kind: str  # function | layer | module
    trainable_semantics: str  # affine | inference | none
    updates: str  # update_ops | inline | layer | module | manual
    momentum_convention: str  # tf | torch | none
    synced: bool
    defaults: dict[str, object]
    migration: Migration | None = None  # set for deprecated APIs
    synced_counterpart: str | None = None  # what synchronizes it across devices (BN006)
    registers: tuple[str, ...] = ()  # collections its moving statistics join (MODEL_VARIABLES)
    training_none: bool = True  # its training flag accepts None
    frozen_drops_updates: bool = False  # trainable=False also drops its update ops (tf.layers)


class RuleBookError(Exception):
    """A rule or catalogue file is malformed: names the file and what is wrong."""


class Example(NamedTuple):
    """A rule's example (from its TOML): the rule must flag an invalid one, leave a valid one, fix
    a fix one."""

    kind: str  # valid | invalid | fix
    source: str  # "" for an artifact rule's example, or a multi-file one
    lines: tuple[int, ...] = ()  # rows where an invalid example must be flagged
    fixed: str | None = None  # the expected result of `fix --unsafe-fixes`
    name: str = ""
    # a multi-file example: a small project (path -> source), the rows flagged per file, and
    # the files a fix changes (path -> expected text)
    files: dict[str, str] | None = None
    file_lines: Mapping[str, tuple[int, ...]] = MappingProxyType({})
    fixed_files: dict[str, str] | None = None
    # artifact rules: the artifact IR as plain data (`bnfix.artifacts.literal`), or a file to
    # write and read ({name, text | hex}); `flagged`: the layers an invalid example reports
    artifact: dict[str, Any] | None = None
    file: dict[str, str] | None = None
    flagged: tuple[str, ...] = ()
    # runtime rules: recordings as data (`bnfix.doctor.record`, one per rank); `flagged`: the
    # layers an invalid example reports
    recordings: tuple[dict[str, Any], ...] = ()


class RuleDocs(NamedTuple):
    """A rule's documentation, in ruff's sections."""

    what: str
    why: str
    example: str
    use_instead: str
    fix_safety: str
    references: tuple[str, ...] = ()
    known_problems: str = ""  # where the rule is known to miss or over-report


class Rule(NamedTuple):
    """One rule: its data from `rules/BNxxx.toml` (its logic is in `bnfix.checks`)."""

    code: str
    name: str
    summary: str
    severity: str
    fix: str
    frameworks: tuple[str, ...]
    triggers: tuple[str, ...]  # the rule concerns a text holding one of these words
    in_tests: bool  # reported in test modules too (False: tests exercise such values on purpose)
    details: RuleDetails  # its docs and examples, read when first asked for
    path: Path
    target: str = "source"
    project: bool = False  # also fires on what other files of the project say about a file
    default: bool = True  # on unless deselected (False: opt-in, e.g. style and cost rules)
    requires: tuple[str, ...] = ()  # ... and, when given, one of these words too

    @property
    def url(self) -> str:
        return DOCS_URL.format(code=self.code)

    @property
    def docs(self) -> RuleDocs:
        return self.details.get()[0]

    @property
    def examples(self) -> tuple[Example, ...]:
        return self.details.get()[1]

    def markdown(self) -> str:
        """The rule's documentation in ruff's shape (what `bnfix rule CODE` prints)."""
        fix_line = {
            "safe": "Fix is always available.",
            "mixed": "Fix is sometimes available (safe where the rewrite is exact, otherwise "
                     "unsafe: needs `--unsafe-fixes`; see Fix safety).",
            "unsafe": "Fix is sometimes available (unsafe: needs `--unsafe-fixes`).",
            "display-only": "A suggested fix is shown, never applied.",
            "none": "No fix is available.",
        }[self.fix]
        parts = [
            f"# {self.name} ({self.code})",
            "",
            f"{self.summary}",
            "",
            f"Frameworks: {', '.join(self.frameworks)}. Severity: {self.severity}. {fix_line}",
            "",
            "## What it does",
            self.docs.what.strip(),
            "",
            "## Why is this bad?",
            self.docs.why.strip(),
            "",
            *(["## Known problems", self.docs.known_problems.strip(), ""]
              if self.docs.known_problems else []),
            "## Example",
            "```python",
            self.docs.example.strip("\n"),
            "```",
            "",
            "## Use instead",
            "```python",
            self.docs.use_instead.strip("\n"),
            "```",
            "",
            "## Fix safety",
            self.docs.fix_safety.strip(),
        ]
        if self.docs.references:
            parts += ["", "## References", *(f"- {ref}" for ref in self.docs.references)]
        return "\n".join(parts) + "\n"


class ApiSpec(NamedTuple):
    """One catalogue entry: a BN API and how to read its arguments."""

    id: str
    framework: str
    kind: str
    names: tuple[str, ...]
    params: tuple[str, ...]
    call_params: tuple[str, ...]
    canonical: dict[str, str]
    defaults: dict[str, object]
    trainable_semantics: str
    updates: str
    momentum_convention: str
    synced: bool
    synced_counterpart: str | None
    migration: Migration | None = None
    registers: tuple[str, ...] = ()  # collections its moving statistics join (MODEL_VARIABLES)
    training_none: bool = True  # its training flag accepts None (Keras: the learning phase)
    frozen_drops_updates: bool = False  # trainable=False also drops its update ops (tf.layers)

    def canonical_name(self, param: str) -> str:
        return self.canonical.get(param, param)

    @property
    def ref(self) -> ApiRef:
        """What the IR keeps of it (made per BN site: a few per file)."""
        return ApiRef(
            id=self.id,
            framework=self.framework,
            kind=self.kind,
            trainable_semantics=self.trainable_semantics,
            updates=self.updates,
            momentum_convention=self.momentum_convention,
            synced=self.synced,
            defaults=dict(self.defaults),
            migration=self.migration,
            synced_counterpart=self.synced_counterpart,
            registers=self.registers,
            training_none=self.training_none,
            frozen_drops_updates=self.frozen_drops_updates,
        )


class LayerSpec(NamedTuple):
    """A layer with an additive bias (conv, linear, dense): where its bias switch is."""

    framework: str
    params: tuple[str, ...]
    bias: str  # the parameter that switches the bias off (`bias`, `use_bias`)
    activation: str | None  # Keras layers apply an activation after the bias
    functional: bool = False  # a function applied to its input (`tf.layers.conv2d(x, ...)`)
    legacy_bias: str | None = None  # an older API's switch, when a call writes it (Keras 1 `bias`)


class Catalogue:
    """Qualified name -> BN API, plus the TF1 training-graph vocabulary for context analysis
    (filled in by the loader)."""

    __slots__ = ("_normalized", "aliases", "apis", "layers", "training")

    def __init__(self) -> None:
        self.apis: dict[str, ApiSpec] = {}  # by normalized qualified name
        self.aliases: list[tuple[str, str]] = []  # longest prefix first
        self._normalized: dict[str, str] = {}
        self.training: dict[str, Any] = {}  # training-API vocabulary tables
        self.layers: dict[str, LayerSpec] = {}  # bias-carrying layers (BN104)

    def normalize(self, qualname: str) -> str:
        """Rewrite known alias prefixes (`tensorflow.compat.v1.` -> `tensorflow.`) to fixpoint
        (memoized: the same few names recur in every file)."""
        known = self._normalized.get(qualname)
        if known is None:
            known = self._normalized[qualname] = self._normalize(qualname)
        return known

    def _normalize(self, qualname: str) -> str:
        for _ in range(4):
            for prefix, target in self.aliases:
                if qualname.startswith(prefix):
                    qualname = target + qualname[len(prefix) :]
                    break
            else:
                return qualname
        return qualname

    def lookup(self, qualname: str) -> ApiSpec | None:
        return self.apis.get(self.normalize(qualname))

    def trigger_words(self, framework: str | None = None) -> tuple[str, ...]:
        """The last component of every BN API name (of one framework): a file that mentions
        none of them holds no such BN site."""
        return tuple(sorted({name.rsplit(".", 1)[-1] for name, spec in self.apis.items()
                             if framework is None or spec.framework == framework}))


class RuleBook(NamedTuple):
    """Every rule by code, and the BN API catalogue."""

    rules: dict[str, Rule]
    catalogue: Catalogue
    digest: str  # of the files it was loaded from (see `files_digest`): part of the cache's key

    def get(self, code: str) -> Rule | None:
        return self.rules.get(code.upper())

    def by_name(self, name: str) -> Rule | None:
        return next((r for r in self.rules.values() if r.name == name), None)

    def expand(self, selectors: list[str], target: str | None = "source") -> set[str]:
        """Codes matched by selectors: `ALL`, a full code, a prefix (`BN0`), or a rule name;
        only rules of `target` (`bnfix check` runs source rules, `bnfix inspect` artifact
        rules; None: every rule). A selector that matches no rule at all is an error."""
        out = self._expand(selectors)
        return out if target is None else {c for c in out if self.rules[c].target == target}

    def misplaced(self, selectors: list[str], target: str) -> tuple[str, str] | None:
        """The first selector that matches rules of another target only (`--select BN201` on
        `bnfix check`), with that target; None when every selector fits `target` (an unknown
        selector is left to `expand` to report)."""
        for sel in selectors:
            try:
                codes = self._expand([sel])
            except RuleBookError:
                continue
            targets = {self.rules[c].target for c in codes}
            if codes and target not in targets:
                return sel, min(targets)
        return None

    def _expand(self, selectors: list[str]) -> set[str]:
        out: set[str] = set()
        for sel in selectors:
            sel = sel.strip()
            if not sel:
                continue
            if sel.upper() == "ALL":
                out |= set(self.rules)
                continue
            rule = self.by_name(sel)
            if rule is not None:
                out.add(rule.code)
                continue
            matched = {code for code in self.rules if code.startswith(sel.upper())}
            if not matched:
                raise RuleBookError(f"unknown rule selector `{sel}` (see `bnfix rules`)")
            out |= matched
        return out


def rules_root() -> Path:
    """Where the installed rule book lives: the package `bnfix.rules` (the repository's `rules/`
    in an editable install), found without importing importlib.resources (a tenth of bnfix's
    start-up)."""
    spec = importlib.util.find_spec("bnfix.rules")
    if spec is None or not spec.submodule_search_locations:
        raise RuleBookError("the rule book (package bnfix.rules) is not installed: reinstall bnfix")
    return Path(next(iter(spec.submodule_search_locations)))


def rule_files(root: Path) -> list[Path]:
    """The rule book's files: one per rule, then the catalogue's."""
    return [*sorted(root.glob("BN*.toml")), *sorted((root / "catalogue").glob("*.toml"))]


def toml_module() -> ModuleType:
    """tomllib (tomli before Python 3.11), imported on first need: a run whose rule book comes
    from the cache folder and that has no configuration file parses no TOML."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on Python 3.10 only
        import tomli as tomllib
    return tomllib


def _read_toml(path: Path) -> dict[str, Any]:
    tomllib = toml_module()
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise RuleBookError(f"{path}: cannot read rule data: {exc}") from exc


def _require(data: dict[str, Any], key: str, path: Path) -> Any:
    if key not in data:
        raise RuleBookError(f"{path}: missing required key `{key}`")
    return data[key]


DOC_KEYS = frozenset(RuleDocs._fields)
# the keys of a rule file that only `bnfix rule`, SARIF's rule descriptions and the example
# tests read (86% of the rule book's data): kept apart in the cache folder, read when asked for
DETAIL_KEYS = ("docs", "examples")
# a rule file's keys are the Rule's fields, spelled as in TOML (`in-tests`), its path aside
RULE_KEYS = frozenset(f.replace("_", "-") for f in Rule._fields) - {"path", "details"} | \
    set(DETAIL_KEYS)


class RuleDetails:
    """A rule's documentation and examples: given when the rule file was just parsed (and
    checked), else read on first use from the cache folder's copy (`source`), or from the rule
    file itself when that copy is missing or damaged."""

    __slots__ = ("_path", "_source", "_value")

    def __init__(self, path: Path, source: _DetailsFile | None = None,
                 value: tuple[RuleDocs, tuple[Example, ...]] | None = None) -> None:
        self._path, self._source, self._value = path, source, value

    def get(self) -> tuple[RuleDocs, tuple[Example, ...]]:
        if self._value is None:
            data = self._source.data(self._path) if self._source is not None else None
            try:
                self._value = _details(data, self._path) if data is not None else None
            except RuleBookError:
                self._value = None  # not what the rule file says: read the file
            if self._value is None:
                self._value = _details(_read_toml(self._path), self._path)
        return self._value

    def __repr__(self) -> str:
        docs, examples = self.get()
        return f"RuleDetails(docs={docs!r}, examples={examples!r})"


def _load_rule(path: Path, read: Callable[[Path], dict[str, Any]] = _read_toml,
               details: RuleDetails | None = None) -> Rule:
    """A rule from its file's data; its docs and examples are checked now unless `details`
    stands for them (data read back from the cache folder, checked when the file was parsed)."""
    data = read(path)
    unknown = sorted(set(data) - RULE_KEYS)
    if unknown:
        raise RuleBookError(f"{path}: unknown key `{unknown[0]}` (known: "
                            f"{', '.join(sorted(RULE_KEYS))})")
    docs = _docs(data, path) if details is None else None
    fix = _require(data, "fix", path)
    if fix not in FIX_KINDS:
        raise RuleBookError(f"{path}: fix must be one of {FIX_KINDS}, not `{fix}`")
    target = data.get("target", "source")
    if target not in TARGETS:
        raise RuleBookError(f"{path}: target must be one of {TARGETS}, not `{target}`")
    if docs is not None:
        details = RuleDetails(path, value=(docs, _examples(data, path)))
    code = _require(data, "code", path)
    if path.stem != code:
        raise RuleBookError(f"{path}: file name must be the rule code `{code}`")
    assert details is not None  # given, or made from the data just checked
    return Rule(
        code=code,
        name=_require(data, "name", path),
        summary=_require(data, "summary", path),
        severity=data.get("severity", "error"),
        fix=fix,
        frameworks=tuple(data.get("frameworks", ())),
        triggers=tuple(data.get("triggers", ())),
        requires=tuple(data.get("requires", ())),
        in_tests=bool(data.get("in-tests", True)),
        details=details,
        path=path,
        target=target,
        project=_flag(data, "project", False, path),
        default=_flag(data, "default", True, path),
    )


def _details(data: dict[str, Any], path: Path) -> tuple[RuleDocs, tuple[Example, ...]]:
    """A rule's docs and examples from its file's data (`target` and the two keys)."""
    return _docs(data, path), _examples(data, path)


def _docs(data: dict[str, Any], path: Path) -> RuleDocs:
    docs = _require(data, "docs", path)
    unknown = sorted(set(docs) - DOC_KEYS)
    if unknown:
        raise RuleBookError(f"{path}: unknown key `docs.{unknown[0]}` (known: "
                            f"{', '.join(sorted(DOC_KEYS))})")
    return RuleDocs(
        what=_require(docs, "what", path),
        why=_require(docs, "why", path),
        example=_require(docs, "example", path),
        use_instead=_require(docs, "use_instead", path),
        fix_safety=_require(docs, "fix_safety", path),
        references=tuple(docs.get("references", ())),
        known_problems=docs.get("known_problems", ""),
    )


def _examples(data: dict[str, Any], path: Path) -> tuple[Example, ...]:
    target = data.get("target", "source")
    examples = []
    for i, ex in enumerate(data.get("examples", [])):
        kind = _require(ex, "kind", path)
        if kind not in EXAMPLE_KINDS:
            raise RuleBookError(f"{path}: example {i}: kind must be one of {EXAMPLE_KINDS}")
        if kind == "fix" and "fixed" not in ex:
            raise RuleBookError(f"{path}: example {i}: a fix example needs `fixed`")
        if target == "artifact":
            examples.append(_artifact_example(ex, kind, i, path))
            continue
        if target == "runtime":
            examples.append(_runtime_example(ex, kind, i, path))
            continue
        if "files" in ex:
            examples.append(_project_example(ex, kind, i, path))
            continue
        examples.append(
            Example(
                kind=kind,
                source=_require(ex, "source", path),
                lines=tuple(ex.get("lines", ())),
                fixed=ex.get("fixed"),
                name=ex.get("name", f"{kind}-{i}"),
            )
        )
    return tuple(examples)


def _flag(data: dict[str, Any], key: str, default: bool, path: Path) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise RuleBookError(f"{path}: `{key}` must be true or false")
    return value


def _project_example(ex: dict[str, Any], kind: str, i: int, path: Path) -> Example:
    """A multi-file example: `files` (path -> source), `lines` (path -> flagged rows) and, for
    a fix example, `fixed` (path -> expected text of each file the fix changes)."""
    files, lines, fixed = ex["files"], ex.get("lines", {}), ex.get("fixed")
    where = f"{path}: example {i}"
    if not isinstance(files, dict) or len(files) < 2 or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise RuleBookError(f"{where}: `files` maps two or more paths to sources")
    if not isinstance(lines, dict) or not set(lines) <= set(files):
        raise RuleBookError(f"{where}: `lines` maps paths of `files` to flagged rows")
    if kind == "valid" and lines:
        raise RuleBookError(f"{where}: a valid example flags no rows")
    if kind != "valid" and not any(lines.values()):
        raise RuleBookError(f"{where}: an {kind} example lists the rows it flags")
    if kind == "fix" and (not isinstance(fixed, dict) or not set(fixed) <= set(files)):
        raise RuleBookError(f"{where}: `fixed` maps paths of `files` to their fixed text")
    return Example(kind=kind, source="", name=ex.get("name", f"{kind}-{i}"), files=dict(files),
                   file_lines={k: tuple(v) for k, v in lines.items()},
                   fixed_files=dict(fixed) if fixed else None)


def _artifact_example(ex: dict[str, Any], kind: str, i: int, path: Path) -> Example:
    """An artifact rule's example: an artifact (as data) or a file, and the flagged layers."""
    if kind == "fix":
        raise RuleBookError(f"{path}: example {i}: artifact rules have no fix examples")
    artifact, file = ex.get("artifact"), ex.get("file")
    if (artifact is None) == (file is None):
        raise RuleBookError(f"{path}: example {i}: give exactly one of `artifact` or `file`")
    if file is not None and ("name" not in file or ("text" in file) == ("hex" in file)):
        raise RuleBookError(f"{path}: example {i}: `file` needs `name` and one of `text`/`hex`")
    flagged = tuple(ex.get("flagged", ()))
    if kind == "invalid" and not flagged:
        raise RuleBookError(f"{path}: example {i}: an invalid example lists what it `flagged`")
    return Example(kind=kind, source="", name=ex.get("name", f"{kind}-{i}"), artifact=artifact,
                   file=file, flagged=flagged)


def _runtime_example(ex: dict[str, Any], kind: str, i: int, path: Path) -> Example:
    """A runtime rule's example: recordings (one per rank) and the flagged layers."""
    if kind == "fix":
        raise RuleBookError(f"{path}: example {i}: runtime rules have no fix examples")
    recordings = ex.get("recordings")
    if not isinstance(recordings, list) or not recordings:
        raise RuleBookError(f"{path}: example {i}: a runtime example lists its `recordings`")
    flagged = tuple(ex.get("flagged", ()))
    if kind == "invalid" and not flagged:
        raise RuleBookError(f"{path}: example {i}: an invalid example lists what it `flagged`")
    return Example(kind=kind, source="", name=ex.get("name", f"{kind}-{i}"), flagged=flagged,
                   recordings=tuple(recordings))


# the catalogue's vocabulary tables for the source analysis (merged across files) …
TRAINING_TABLES = ("functions", "methods", "collections", "train_ops", "variable_sources",
                   "collection_sources", "training_flags", "optimizers", "bn_free", "restores",
                   "summary", "removed_by_keras3")
# … and every top-level key a catalogue file may have (`module`: bnfix.torch's conversions)
CATALOGUE_KEYS = frozenset({"alias", "api", "migration", "layer", "module", *TRAINING_TABLES})


def _load_catalogue(folder: Path, read: Callable[[Path], dict[str, Any]] = _read_toml
                    ) -> Catalogue:
    cat = Catalogue()
    aliases: list[tuple[str, str]] = []
    migrations: list[tuple[Path, dict[str, Any]]] = []
    for path in sorted(folder.glob("*.toml")):
        data = read(path)
        for alias in data.get("alias", []):
            aliases.append((alias["prefix"], alias["replace"]))
        for entry in data.get("api", []):
            spec = ApiSpec(
                id=_require(entry, "id", path),
                framework=_require(entry, "framework", path),
                kind=_require(entry, "kind", path),
                names=tuple(_require(entry, "names", path)),
                params=tuple(entry.get("params", ())),
                call_params=tuple(entry.get("call_params", ())),
                canonical=dict(entry.get("canonical", {})),
                defaults=dict(entry.get("defaults", {})),
                trainable_semantics=entry.get("trainable_semantics", "none"),
                updates=entry.get("updates", "manual"),
                momentum_convention=entry.get("momentum_convention", "none"),
                synced=bool(entry.get("synced", False)),
                synced_counterpart=entry.get("synced_counterpart"),
                registers=tuple(entry.get("registers", ())),
                training_none=bool(entry.get("training_none", True)),
                frozen_drops_updates=bool(entry.get("frozen_drops_updates", False)),
            )
            for name in spec.names:
                if name in cat.apis:
                    raise RuleBookError(f"{path}: `{name}` is in two catalogue entries")
                cat.apis[name] = spec
        unknown = sorted(set(data) - CATALOGUE_KEYS)
        if unknown:
            raise RuleBookError(f"{path}: unknown catalogue table `{unknown[0]}` "
                                f"(known: {', '.join(sorted(CATALOGUE_KEYS))})")
        for key in TRAINING_TABLES:
            if key in data:
                for name, value in data[key].items():
                    table = cat.training.setdefault(key, {})
                    if isinstance(value, list) and isinstance(table.get(name), list):
                        table[name] = table[name] + value
                    else:
                        table[name] = value
        for entry in data.get("layer", []):
            layer = LayerSpec(
                framework=_require(entry, "framework", path),
                params=tuple(_require(entry, "params", path)),
                bias=_require(entry, "bias", path),
                activation=entry.get("activation"),
                functional=_flag(entry, "functional", False, path),
                legacy_bias=entry.get("legacy_bias"),
            )
            for name in _require(entry, "names", path):
                cat.layers[name] = layer
        migrations.extend((path, m) for m in data.get("migration", []))
    cat.aliases = sorted(aliases, key=lambda a: -len(a[0]))
    by_id = {spec.id: spec for spec in cat.apis.values()}
    for path, entry in migrations:
        source = by_id.get(_require(entry, "from", path))
        if source is None:
            raise RuleBookError(f"{path}: migration from unknown API id `{entry['from']}`")
        migrated = source._replace(migration=_migration(entry, path))
        for name in source.names:
            cat.apis[name] = migrated
    return cat


def _version(text: str | None) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")) if text else ()


def _migration(entry: dict[str, Any], path: Path) -> Migration:
    return Migration(
        to=_require(entry, "to", path),
        why=_require(entry, "why", path),
        written=tuple(entry.get("written", ())),
        since=_version(entry.get("since")),
        removed=_version(entry.get("removed")),
        positional=int(entry.get("positional", 0)),
        rename=dict(entry.get("rename", {})),
        defaults=dict(entry.get("defaults", {})),
        values={k: dict(v) for k, v in entry.get("values", {}).items()},
        split={k: dict(v) for k, v in entry.get("split", {}).items()},
        require_str=tuple(entry.get("require_str", ())),
        refuse=dict(entry.get("refuse", {})),
        keep_unknown=bool(entry.get("keep_unknown", False)),
        add=tuple(entry.get("add", ())),
        display_only=bool(entry.get("display_only", False)),
        safe_when=tuple(entry.get("safe_when", ())),
    )


def load_rulebook(root: Path | None = None, cache: Path | None = None) -> RuleBook:
    """Load every rule file and the catalogue (kept for the default location). `cache`: a
    folder where the files' parsed data is kept (a run's cache folder): TOML is parsed only
    when the files changed, and every load checks the data as it checks the files' (the docs
    and examples when first read)."""
    global _DEFAULT
    if root is None:
        if _DEFAULT is None:
            _DEFAULT = load_rulebook(rules_root(), cache)
        return _DEFAULT
    from bnfix.cache import files_digest

    paths = rule_files(root)
    digest = files_digest(paths, root)  # editing a rule or the catalogue empties the cache
    names = {path: path.relative_to(root).as_posix() for path in paths}
    kept = _kept(cache, names, digest) if cache is not None else None
    parsed = kept[0] if kept is not None else _parse_files(paths) if cache is not None else {}

    def read(path: Path) -> dict[str, Any]:
        return parsed[path] if path in parsed else _read_toml(path)

    rules = {}
    for path in paths:
        if path.parent == root:  # the catalogue's files are read below
            rule = _load_rule(path, read, RuleDetails(path, kept[1]) if kept else None)
            rules[rule.code] = rule
    book = RuleBook(rules=rules, catalogue=_load_catalogue(root / "catalogue", read),
                    digest=digest)
    if cache is not None and kept is None and parsed:  # checked whole: worth keeping
        _write_parsed(cache, digest, {names[path]: data for path, data in parsed.items()},
                      {names[path] for path in paths if path.parent == root})
    return book


_DEFAULT: RuleBook | None = None
# the parsed rule book in a cache folder: rulebook-<digest>.parsed, the rules' docs and
# examples beside it in rulebook-<digest>.details
PARSED_PREFIX = "rulebook-"
PARSED_FORMAT = 2  # in the files' names: a bnfix that kept them otherwise does not read them
_MAX_PARSED_BYTES = 64 << 20


class _DetailsFile:
    """The docs and examples of every rule as a cache folder keeps them: one file, read when
    the first rule's are asked for."""

    __slots__ = ("_data", "names", "path")

    def __init__(self, path: Path, names: dict[Path, str]) -> None:
        self.path, self.names = path, names
        self._data: dict[str, Any] | None = None

    def data(self, rule: Path) -> dict[str, Any] | None:
        if self._data is None:
            from bnfix.source.reader import Skipped, SourceError, read_source

            self._data = {}
            try:  # a FIFO or a huge file planted there is refused without blocking
                loaded = json.loads(read_source(self.path, _MAX_PARSED_BYTES).decode("utf-8"))
                self._data = loaded if isinstance(loaded, dict) else {}
            except (SourceError, Skipped, ValueError, RecursionError):
                pass  # absent or damaged: each rule's file is read instead
        entry = self._data.get(self.names.get(rule, ""))
        return entry if isinstance(entry, dict) else None


def _kept(folder: Path, names: dict[Path, str], digest: str
          ) -> tuple[dict[Path, dict[str, Any]], _DetailsFile] | None:
    """The data of the rule files, without their docs and examples, from `folder` when it
    holds the parse of these very files (by their `digest`); None when it does not (parsing
    the TOML was a fifth of bnfix's start-up; the docs and examples were 86% of its data)."""
    from bnfix.source.reader import Skipped, SourceError, read_source

    stem = folder / f"{PARSED_PREFIX}{digest[:24]}-{PARSED_FORMAT}"
    try:  # a FIFO or a huge file planted there is refused without blocking
        data = json.loads(read_source(stem.with_suffix(".parsed"),
                                      _MAX_PARSED_BYTES).decode("utf-8"))
    except (SourceError, Skipped, ValueError, RecursionError):
        return None  # absent, or not what this bnfix wrote: parse the files
    paths = {name: path for path, name in names.items()}
    if not isinstance(data, dict) or set(data) != set(paths) or \
            not all(isinstance(v, dict) for v in data.values()):
        return None
    return ({paths[name]: value for name, value in data.items()},
            _DetailsFile(stem.with_suffix(".details"), names))


def _parse_files(paths: list[Path]) -> dict[Path, dict[str, Any]]:
    try:
        texts = {path: path.read_bytes() for path in paths}
    except OSError:
        return {}  # the load reports the unreadable file
    return {path: _parse(path, text) for path, text in texts.items()}


def _parse(path: Path, text: bytes) -> dict[str, Any]:
    tomllib = toml_module()
    try:
        return tomllib.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RuleBookError(f"{path}: cannot read rule data: {exc}") from exc


def _write_parsed(folder: Path, digest: str, data: dict[str, dict[str, Any]],
                  rules: set[str]) -> None:
    """Store the parse (the rules' docs and examples apart), removing those of other rule
    books (an upgraded bnfix's)."""
    from bnfix.cache import prepare_folder, write_json

    stem = folder / f"{PARSED_PREFIX}{digest[:24]}-{PARSED_FORMAT}"
    core = {name: {k: v for k, v in entry.items() if name not in rules or k not in DETAIL_KEYS}
            for name, entry in data.items()}
    details = {name: {k: entry[k] for k in (*DETAIL_KEYS, "target") if k in entry}
               for name, entry in data.items() if name in rules}
    try:
        prepare_folder(folder)
        write_json(stem.with_suffix(".details"), details)
        write_json(stem.with_suffix(".parsed"), core)  # last: its presence says both are there
        for old in [*folder.glob(PARSED_PREFIX + "*.parsed"),
                    *folder.glob(PARSED_PREFIX + "*.details")]:
            if old.stem != stem.name:
                old.unlink()
    except (OSError, TypeError, ValueError):
        return  # a read-only place (or data JSON cannot hold): parse the files next time


def rules_table_markdown(book: RuleBook) -> str:
    """The README's rule table, generated from the rule files."""
    rows = ["| code | name | summary | fix | on by default |", "|---|---|---|---|---|"]
    for code in sorted(book.rules):
        rule = book.rules[code]
        on = "yes" if rule.default else "opt-in"
        summary = rule.summary.replace("|", "\\|")  # a `|` inside a cell would split it
        rows.append(f"| {code} | {rule.name} | {summary} | {rule.fix} | {on} |")
    return "\n".join(rows) + "\n"


# Module conversions (bnfix.torch): the `module` table of rules/catalogue/torch_modules.toml.
MODULE_ACTIONS = ("convert_sync", "freeze", "fold")
MODULE_OUTCOMES = ("plain", "behaviour", "affine", "skip")


class ModuleSpec(NamedTuple):
    """A norm layer class of torch or a model library and what each conversion does with it:
    `outcomes[action]` is "plain", "behaviour", "affine", "skip" or "refuse: <reason>"."""

    cls: str
    library: str
    what: str
    outcomes: dict[str, str]

    def outcome(self, action: str) -> str:
        return self.outcomes.get(action, "behaviour")

    def refusal(self, action: str) -> str | None:
        outcome = self.outcome(action)
        return outcome.removeprefix("refuse:").strip() if outcome.startswith("refuse:") else None


def _module_spec(entry: dict[str, Any], path: Path) -> ModuleSpec:
    outcomes = {action: entry[action] for action in MODULE_ACTIONS if action in entry}
    for action, outcome in outcomes.items():
        if outcome not in MODULE_OUTCOMES and not outcome.startswith("refuse:"):
            raise RuleBookError(f"{path}: {entry.get('class')}: {action} = {outcome!r} is not "
                                f"one of {', '.join(MODULE_OUTCOMES)} or 'refuse: <reason>'")
    return ModuleSpec(_require(entry, "class", path), entry.get("library", ""),
                      entry.get("what", ""), outcomes)


@functools.lru_cache(maxsize=1)
def torch_modules() -> dict[str, ModuleSpec]:
    """Every `[[module]]` entry of the catalogue, by class name."""
    specs: dict[str, ModuleSpec] = {}
    for path in sorted((rules_root() / "catalogue").glob("*.toml")):
        for entry in _read_toml(path).get("module", []):
            spec = _module_spec(entry, path)
            if spec.cls in specs:
                raise RuleBookError(f"{path}: module `{spec.cls}` is listed twice")
            specs[spec.cls] = spec
    return specs
