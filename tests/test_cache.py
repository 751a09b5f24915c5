"""The findings cache: unchanged files are not analysed again, any change of content, rules or
configuration is, and the cache can neither run code nor break a run."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from conftest import run_bnfix

from bnfix.cache import FORMAT, Cache
from bnfix.lint import LintOptions, lint_paths, prepare

BUGGY = "import torch.nn as nn\nbn = nn.BatchNorm2d(8, momentum=0.9)\n"
CLEAN = "import torch.nn as nn\nbn = nn.BatchNorm2d(8, momentum=0.1)\n"


def _lint(root: Path, **options):
    opts = LintOptions(paths=[str(root)], progress=False, jobs=1, **options)
    _, settings, engine = prepare(opts, root)
    import io
    return lint_paths(opts, engine, settings, io.StringIO())


def test_second_run_is_served_from_the_cache(tree):
    root = tree({"pyproject.toml": "[tool.bnfix]\n", "a.py": BUGGY, "b.py": CLEAN})
    hour_ago = time.time_ns() - 3600 * 10**9  # not modified around the run: its time is trusted
    os.utime(root / "a.py", ns=(hour_ago, hour_ago))
    first = _lint(root)
    assert [d.code for d in first.remaining] == ["BN008"]
    assert [r.unchanged for r in first.results] == [False]
    assert (root / ".bnfix_cache" / ".gitignore").read_text().strip().endswith("*")
    # same size and mtime, different content: trusted without reading (as ruff does)
    stat = (root / "a.py").stat()
    (root / "a.py").write_text(BUGGY.replace("0.9", "0.1"))
    os.utime(root / "a.py", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert [d.code for d in _lint(root).remaining] == ["BN008"]
    assert _lint(root, cache=False).remaining == []


def test_content_hash_reuses_findings_after_a_touch(tree):
    root = tree({"pyproject.toml": "[tool.bnfix]\n", "a.py": BUGGY})
    _lint(root)
    os.utime(root / "a.py", ns=(1, 1))  # a checkout touched it; the content is the same
    second = _lint(root)
    assert [d.code for d in second.remaining] == ["BN008"]
    assert [r.unchanged for r in second.results] == [True], "found by content hash, not analysed"
    (root / "a.py").write_text(CLEAN)  # a real change is analysed
    assert _lint(root).remaining == []


def test_configuration_and_fixes_invalidate(tree):
    root = tree({"pyproject.toml": "[tool.bnfix]\n", "a.py": BUGGY})
    assert len(_lint(root).remaining) == 1
    assert _lint(root, select=["BN1"]).remaining == []  # another selection: another cache key
    run = run_bnfix("check", "--fix", "--unsafe-fixes", ".", cwd=root)
    assert run.returncode == 0, run.stdout
    assert "1 - 0.9" in (root / "a.py").read_text()
    assert run_bnfix("check", ".", cwd=root).returncode == 0  # the fixed file is cached clean


def test_a_corrupt_or_hostile_cache_is_ignored(tree):
    root = tree({"pyproject.toml": "[tool.bnfix]\n", "a.py": BUGGY})
    _lint(root)
    (cache_file,) = (root / ".bnfix_cache").glob("*.jsonl")
    head, *lines = cache_file.read_text().splitlines()
    assert json.loads(head)["format"] == FORMAT
    # each line: the entry's fields as JSON, then its summary's own JSON after a tab
    records = [line.split("\t") for line in lines]
    assert [json.loads(fields)[0] for fields, _ in records] == [os.path.realpath(root / "a.py")]
    assert all(json.loads(summary) for _, summary in records)
    cache_file.write_bytes(b"\x80\x04\x95 not json: a pickle would run code here")
    assert [d.code for d in _lint(root).remaining] == ["BN008"]
    cache_file.write_text('{"format": 1, "files": {"x": {"bogus": 1}}}')
    assert [d.code for d in _lint(root).remaining] == ["BN008"]
    # a right header with entries that are not: each is ignored, the good one is used
    good = lines[0]
    fields, summary = good.split("\t")
    as_before = json.loads(fields)
    as_before[1]["summary"] = summary  # format 6: the summary as a JSON string in the fields
    no_summary = fields  # its summary's digest without the summary
    bad = ["[1, 2]", "{not json", "[" * 100000, '["x", {}]', json.dumps(as_before), no_summary,
           '["x", []]\t{}', fields.replace('"summary_digest":"', '"summary_digest":null,"x":"')
           + "\t" + summary]
    for line in bad:
        cache_file.write_text(f"{head}\n{line}\n")
        assert Cache(root, cache_file.stem, cache_file.parent).entries == {}, line[:80]
    cache_file.write_text(f"{head}\n{good}\n")
    (entry,) = Cache(root, cache_file.stem, cache_file.parent).entries.values()
    assert entry.summary == summary
    cache_file.write_text("\n".join([head, *bad, good, ""]))
    result = _lint(root)
    assert [d.code for d in result.remaining] == ["BN008"]
    assert [r.unchanged for r in result.results] == [True]  # served from the good line


def test_summaries_with_tabs_and_line_breaks_round_trip(tree):
    """A summary follows its entry's fields after a tab: the source's tabs and line breaks
    (in names, strings, defaults) stay escaped inside it and the next run reads it back."""
    wrapper = ('import tensorflow as tf\n\n\ndef bn(x, is_training, scope="a\\tb\\nc", '
               'trainable=True):\n    return tf.compat.v1.layers.batch_normalization(\n'
               '        x, training=is_training,\tname=scope, trainable=trainable)\n')
    user = ("from layers import bn\n\n\ndef net(x):\n"
            "    return bn(x, is_training=True, scope='tab\\there', trainable=False)\n")
    root = tree({"pyproject.toml": "[tool.bnfix]\n", "layers.py": wrapper, "net.py": user})
    _age(root)
    cold = [(d.path, d.code, d.span) for d in _lint(root, cache=False).remaining]
    assert [c for _, c, _ in cold] == ["BN001"]
    _lint(root)
    (cache_file,) = (root / ".bnfix_cache").glob("*.jsonl")
    _, *lines = cache_file.read_text().splitlines()
    assert len(lines) == 2 and all(line.count("\t") == 1 for line in lines)
    assert any("\\t" in line.split("\t")[1] for line in lines)  # escaped in the summary
    warm = _lint(root)
    assert [(d.path, d.code, d.span) for d in warm.remaining] == cold
    assert all(r.unchanged for r in warm.results)


def test_no_cache_flag_writes_nothing(tree):
    root = tree({"pyproject.toml": "[tool.bnfix]\n", "a.py": BUGGY})
    assert run_bnfix("check", "--no-cache", ".", cwd=root).returncode == 1
    assert not (root / ".bnfix_cache").exists()


WRAPPER = """
import tensorflow as tf


def bn(x, is_training, trainable=True):
    return tf.compat.v1.layers.batch_normalization(x, training=is_training, trainable={passed})
"""
TRAIN = """
import tensorflow as tf

from models.layers import bn


def model(x):
    return bn(x, is_training=True, trainable=False)
"""
UNRELATED = """
import torch.nn as nn

head = nn.BatchNorm2d(8, momentum=0.9)
"""


def _age(root: Path) -> int:
    """Every file's times an hour back (not modified around the runs: stat is trusted); that
    time in ns, for the edits that follow."""
    hour_ago = time.time_ns() - 3600 * 10**9
    for path in root.rglob("*.py"):
        os.utime(path, ns=(hour_ago, hour_ago))
    return hour_ago


def _record_checks(root: Path, monkeypatch) -> list[str]:  # type: ignore[no-untyped-def]
    """The files the project pass checks (not served from the cache), as they happen."""
    from bnfix.project.session import Worker

    checked: list[str] = []
    original = Worker.check_file

    def recording(self, path, *args, **kwargs):  # type: ignore[no-untyped-def]
        checked.append(Path(path).relative_to(root).as_posix())
        return original(self, path, *args, **kwargs)

    monkeypatch.setattr(Worker, "check_file", recording)
    return checked


def test_editing_a_model_file_rechecks_its_users_and_nothing_else(tree, monkeypatch):
    """A finding at a call site depends on the wrapper in another file: editing the wrapper
    re-checks the wrapper and its caller (the finding appears), not an unrelated file."""
    root = tree({"pyproject.toml": "[tool.bnfix]\n", "models/__init__.py": "",
                 "models/layers.py": WRAPPER.format(passed="True"), "train.py": TRAIN,
                 "other.py": UNRELATED})
    hour_ago = _age(root)
    checked = _record_checks(root, monkeypatch)
    first = _lint(root)
    assert sorted(d.code for d in first.remaining) == ["BN008"]
    assert "other.py" in checked and "train.py" in checked
    checked.clear()
    assert sorted(d.code for d in _lint(root).remaining) == ["BN008"]
    assert checked == [], "nothing changed: every file's findings come from the cache"
    (root / "models" / "layers.py").write_text(WRAPPER.format(passed="trainable"))
    os.utime(root / "models" / "layers.py", ns=(hour_ago + 10**9, hour_ago + 10**9))
    third = _lint(root)
    assert sorted((Path(d.path).name, d.code) for d in third.remaining) == [
        ("other.py", "BN008"), ("train.py", "BN001")]
    assert sorted(checked) == ["models/layers.py", "train.py"]


# a script with a BN of its own (so it is summarised) that imports the package
REPORT = ("import torch.nn as nn\n\nimport models\n\nhead = nn.BatchNorm1d(4, momentum=0.9)\n"
          "print(models.heads)\n")


def test_a_file_is_checked_again_for_its_callers_not_for_importers_of_its_package(
        tree, monkeypatch):
    """A module's findings depend on the modules it reaches, those that import it, and those
    whose calls resolve into it (callers of callers): editing a script that imports the
    package does not re-check the package's other modules, unless the script calls into
    them; when it does, the wrapper's module is checked again with it (its finding moves)."""
    wrapper = WRAPPER.format(passed="trainable")
    root = tree({"pyproject.toml": "[tool.bnfix]\n",
                 "models/__init__.py": "from .layers import bn\nfrom . import heads\n",
                 "models/layers.py": wrapper, "models/heads.py": UNRELATED,
                 "report.py": REPORT})
    hour_ago = _age(root)
    checked = _record_checks(root, monkeypatch)
    _lint(root)
    checked.clear()
    (root / "report.py").write_text(REPORT + "tail = nn.BatchNorm1d(2)\n")  # a new summary
    os.utime(root / "report.py", ns=(hour_ago + 10**9, hour_ago + 10**9))
    assert sorted(d.code for d in _lint(root).remaining) == ["BN008", "BN008"]
    assert "report.py" in checked  # and the package it imports (whether anything imports it)
    assert "models/layers.py" not in checked and "models/heads.py" not in checked
    checked.clear()
    (root / "report.py").write_text(REPORT + "\nout = models.bn(images, True, trainable=False)\n")
    os.utime(root / "report.py", ns=(hour_ago + 2 * 10**9, hour_ago + 2 * 10**9))
    warm = sorted((Path(d.path).name, d.code) for d in _lint(root).remaining)
    assert "models/layers.py" in checked and "models/heads.py" not in checked
    assert warm == sorted((Path(d.path).name, d.code) for d in _lint(root, cache=False).remaining)
    assert ("report.py", "BN001") in warm


# a training script that calls a helper of the wrapper's module before the helper exists
CALLS_HELPER = TRAIN + "\nfrom models import layers\n\nscaled = layers.helper(images)\n"


def _wrapper_project(tree, monkeypatch):  # type: ignore[no-untyped-def]
    """The wrapper's module, a script that uses it and one that calls a helper of it (aged):
    its root, the age, the files checked as they happen, and its findings by (file, code, row)."""
    root = tree({"pyproject.toml": "[tool.bnfix]\n", "models/__init__.py": "",
                 "models/layers.py": WRAPPER.format(passed="trainable"), "train.py": TRAIN,
                 "eval.py": CALLS_HELPER})
    hour_ago = _age(root)
    checked = _record_checks(root, monkeypatch)

    def findings(**options) -> list[tuple[str, str, int]]:
        return sorted((Path(d.path).name, d.code, d.span.start.row)
                      for d in _lint(root, **options).remaining)

    return root, hour_ago, checked, findings


def test_a_silent_helper_added_to_a_shared_module_rechecks_that_module_alone(tree, monkeypatch):
    """A top-level function that builds no BN, calls no first-party code and has no facts
    changes nothing another file's check reads: adding one to the wrapper's module re-checks
    that module and not its users. A user whose call now resolves to it has a new key (its
    resolved callees are in it) but the same project context (the helper has nothing to
    attach), so its findings stand too; warm equals cold at every step."""
    root, hour_ago, checked, findings = _wrapper_project(tree, monkeypatch)
    cold = findings()
    assert ("train.py", "BN001") in {(name, code) for name, code, _ in cold}
    linked = _record_links(monkeypatch)
    layers = root / "models" / "layers.py"
    # nothing names `unrelated`: the users keep their cached edges; eval.py calls
    # `layers.helper`, which now resolves: every module that reaches layers.py is linked again
    for step, (helper, relinked) in enumerate([
            ("\n\ndef unrelated(x):\n    return x * 2\n", ["models.layers"]),
            ("\n\ndef helper(x):\n    return x + 1\n", ["eval", "models.layers", "train"])],
            start=1):
        checked.clear()
        linked.clear()
        layers.write_text(layers.read_text() + helper)
        os.utime(layers, ns=(hour_ago + step * 10**9, hour_ago + step * 10**9))
        warm = findings()
        rechecked, warm_linked = sorted(checked), sorted(linked)
        assert warm == findings(cache=False)
        assert rechecked == ["models/layers.py"]
        assert warm_linked == relinked


def _appended(module: Path, hour_ago: int, findings, recorded: list[str],  # type: ignore[no-untyped-def]
              steps: list[tuple[str, list[str]]], checked: list[str] | None = None):
    """Each step's text appended to `module` (a second later each time): the warm run's
    findings must equal a cold run's, and what `recorded` records in the warm run (modules)
    must be the step's list; yields the text and the warm findings (`checked`: the files
    the warm run checked, as they stand then)."""
    for step, (added, expected) in enumerate(steps, start=1):
        recorded.clear()
        if checked is not None:
            checked.clear()
        module.write_text(module.read_text() + added)
        os.utime(module, ns=(hour_ago + step * 10**9, hour_ago + step * 10**9))
        warm = findings()
        seen = sorted(set(recorded))
        warm_checked = list(checked or ())
        assert warm == findings(cache=False)
        assert seen == expected, step
        if checked is not None:
            checked[:] = warm_checked
        yield added, warm


def _record_links(monkeypatch) -> list[str]:  # type: ignore[no-untyped-def]
    """The modules whose edges and resolved calls the run computes (not from the cache)."""
    from bnfix.project import runner

    linked: list[str] = []
    original = runner.module_links

    def recording(index, module):  # type: ignore[no-untyped-def]
        linked.append(module)
        return original(index, module)

    monkeypatch.setattr(runner, "module_links", recording)
    return linked


def test_a_function_added_to_a_shared_module_keeps_its_users_resolved_calls(tree, monkeypatch):
    """The users of a module keep their cached edges and resolved calls when the module's
    summary resolves names as before but for new functions that none of them names (a new
    wrapper, a new BN builder); a new function that one of them calls, or a new class (or
    method, base, import: names resolve differently), links every module that reaches it
    again. Warm equals cold each time."""
    root, hour_ago, _, findings = _wrapper_project(tree, monkeypatch)
    findings()
    linked = _record_links(monkeypatch)
    layers = root / "models" / "layers.py"
    steps = [("\n\ndef bn_frozen(x):\n    return bn(x, True, trainable=False)\n", ["models.layers"]),
             # eval.py calls `layers.helper`: a name it mentions, so it is linked again (and
             # the others that reach the module: one test of the text is all there is)
             ("\n\ndef helper(x):\n    return bn(x, True, trainable=False)\n",
              ["eval", "models.layers", "train"]),
             ("\n\ndef head(x):\n    return tf.keras.layers.BatchNormalization()(x)\n",
              ["models.layers"]),
             ("\n\nclass Head:\n    def __call__(self, x):\n        return bn(x, True)\n",
              ["eval", "models.layers", "train"])]
    for added, warm in _appended(layers, hour_ago, findings, linked, steps):
        if added.startswith("\n\ndef helper"):  # the new call in eval.py freezes a BN
            assert ("eval.py", "BN001") in {(name, code) for name, code, _ in warm}


BLOCKS = "import torch.nn as nn\n\n\ndef block(x, momentum):\n    return nn.BatchNorm2d(8, momentum=momentum)(x)\n"


def test_a_file_that_added_functions_cannot_reach_keeps_its_findings_unread(tree, monkeypatch):
    """Functions added to a module that nothing names change another file's project context
    only where their calls attach callers: train.py's key changes with the module's summary,
    but its context is not even computed (its key with the summaries as they were is the
    one its findings were stored under); another call into blocks.py (which layers.py
    called before: the module graph is the same) computes blocks.py's; a function that
    eval.py calls computes every user's. Warm equals cold each time."""
    from bnfix.project import view

    root = tree({"pyproject.toml": "[tool.bnfix]\n", "models/__init__.py": "",
                 "models/blocks.py": BLOCKS,
                 "models/layers.py": WRAPPER.format(passed="trainable")
                 + "\nfrom models import blocks\n\n\ndef base(x):\n    return blocks.block(x, 0.1)\n",
                 "train.py": TRAIN, "eval.py": CALLS_HELPER})
    hour_ago = _age(root)
    checked = _record_checks(root, monkeypatch)
    read: list[str] = []  # the modules whose project context is computed
    original = view.file_context

    def recording(index, module_id, *args):  # type: ignore[no-untyped-def]
        read.append(module_id)
        return original(index, module_id, *args)

    monkeypatch.setattr(view, "file_context", recording)

    def findings(**options) -> list[tuple[str, str, int]]:
        return sorted((Path(d.path).name, d.code, d.span.start.row)
                      for d in _lint(root, **options).remaining)

    findings()
    layers = root / "models" / "layers.py"
    steps = [("\n\ndef frozen_bn(x):\n    return bn(x, True, False)\n", ["models.layers"]),
             ("\n\ndef shaped(x):\n    return blocks.block(x, 0.9)\n",
              ["models.blocks", "models.layers"]),
             ("\n\ndef helper(x):\n    return bn(x, True, False)\n",
              ["eval", "models.blocks", "models.layers", "train"])]
    for _, warm in _appended(layers, hour_ago, findings, read, steps, checked):
        assert "train.py" not in checked and "models/layers.py" in checked
        read.clear()
        assert findings() == warm and read == []  # the new keys were kept


def test_a_function_added_to_a_shared_module_keeps_its_users_name_search(tree, monkeypatch):
    """The name search (which names make a file worth summarising) keeps the parts of the
    modules that reach an edited one when the edit only added functions that nothing else
    names: a new BN builder (its own part is computed again; see `added_functions`). A function that an existing
    one of the module calls (unresolved before: that function's summary changes), or one
    that another module calls, changes what reaches BN there: every module that reaches it
    is searched again. Warm equals cold each time."""
    from bnfix.project import names

    searched: list[str] = []
    original = names.contributions

    def recording(index, modules, *args):  # type: ignore[no-untyped-def]
        modules = list(modules)
        searched.extend(modules)
        return original(index, modules, *args)

    monkeypatch.setattr(names, "contributions", recording)
    root, hour_ago, _, findings = _wrapper_project(tree, monkeypatch)
    (root / "plain.py").write_text("def total(xs):\n    return sum(xs)\n")  # never summarised
    _age(root)
    findings()
    layers = root / "models" / "layers.py"
    users = ["eval", "models.layers", "train"]
    # `apply_it` calls a name nothing binds yet: a silent function, no search at all; once
    # `later` is defined, the call resolves (apply_it's summary changes)
    steps = [("\n\ndef bn_frozen(x):\n    return bn(x, True, trainable=False)\n", ["models.layers"]),
             ("\n\ndef apply_it(x):\n    return later(x)\n", []),
             ("\n\ndef later(x):\n    return bn(x, True, trainable=False)\n", users),
             ("\n\ndef helper(x):\n    return bn(x, True)\n", users)]
    for _ in _appended(layers, hour_ago, findings, searched, steps):
        pass


def test_added_functions_tell_an_edit_that_only_adds_functions_nothing_else_names() -> None:
    from bnfix.project.store import added_functions

    def text(*functions: str, imports: dict[str, str] | None = None) -> str:
        return json.dumps({"format": 1, "digest": "-", "imports": imports or {}, "functions": [
            [name, name, None, [1, 0], [], [], [[c, [2, 0], {}, False, False, [], [], None]
                                               for c in calls], [], []]
            for name, *calls in (f.split(":") for f in functions)]})

    before = text("bn", "model:bn")
    assert added_functions(before, text("bn", "model:bn", "extra:bn")) == ["extra"]
    assert added_functions(before, text("bn")) is None  # a function removed
    assert added_functions(text("bn", "model:later"), text("bn", "model:later", "later")) is None
    assert added_functions(before, text("bn:other", "model:bn")) is None  # a body changed
    assert added_functions(before, text("bn", "model:bn", imports={"np": "numpy"})) is None
    assert added_functions(before, "{") is None and added_functions("[]", before) is None


def test_findings_made_against_the_same_project_context_stand(tree, monkeypatch):
    """An edit that changes a shared module's summary changes the key of every file that
    reaches it; a file is checked again only when what its check reads of the project (its
    context) changed: not for a new wrapper nobody calls, yes for the file that calls a
    function that now builds BN, and for every user when what the wrapper's BN is given
    changes. Warm equals cold at every step, and a run after each is served from the cache."""
    root, hour_ago, checked, findings = _wrapper_project(tree, monkeypatch)
    cold = findings()
    layers = root / "models" / "layers.py"
    steps = [  # (edit of models/layers.py, the files checked again)
        (lambda text: text + "\n\ndef frozen_bn(x):\n    return bn(x, True, False)\n",
         ["models/layers.py"]),  # a new wrapper: its summary changes, nobody calls it
        (lambda text: text + "\n\ndef helper(x):\n    return bn(x, True, False)\n",
         ["eval.py", "models/layers.py"]),  # eval.py's call now reaches a frozen BN
        (lambda text: text.replace("trainable=trainable)", "trainable=False)"),
         ["eval.py", "models/layers.py", "train.py"]),  # what the wrapper's BN is given
        (lambda text: text.replace("trainable=True", "trainable=None"),
         ["models/layers.py"]),  # a default that nobody's call reads any more
    ]
    for step, (edit, expected) in enumerate(steps, start=1):
        checked.clear()
        layers.write_text(edit(layers.read_text()))
        os.utime(layers, ns=(hour_ago + step * 10**9, hour_ago + step * 10**9))
        warm = findings()
        assert sorted(checked) == expected, step
        assert warm == findings(cache=False)
        checked.clear()
        assert findings() == warm and checked == []  # the new keys were kept
    assert findings() != cold  # the edits did change findings


CALLER = """
from models.layers import bn


def model(x):
    return bn(x, is_training=True)
"""


def test_a_callers_new_summary_leaves_the_callees_findings(tree, monkeypatch):
    """A caller's summary changes (an import) without changing what the wrapper's check reads
    of it: the caller is checked again, the wrapper (whose cone holds the caller) is not."""
    root = tree({"pyproject.toml": "[tool.bnfix]\n", "models/__init__.py": "",
                 "models/layers.py": WRAPPER.format(passed="trainable"),
                 "a_user.py": CALLER, "z_user.py": CALLER})
    hour_ago = _age(root)
    checked = _record_checks(root, monkeypatch)
    _lint(root)
    checked.clear()
    user = root / "z_user.py"
    user.write_text(user.read_text() + "\nimport models.layers as spare\n")  # a new summary
    os.utime(user, ns=(hour_ago + 10**9, hour_ago + 10**9))
    warm = sorted((Path(d.path).name, d.code) for d in _lint(root).remaining)
    assert checked == ["z_user.py"]
    assert warm == sorted((Path(d.path).name, d.code) for d in _lint(root, cache=False).remaining)


def test_a_summary_digest_leaves_out_silent_functions_only() -> None:
    """A top-level function with nothing to say leaves the digest as it was; one that shadows
    an import, has a fact, calls first-party code or is a method does not."""
    from bnfix.project.summary import CallRecord, ClassSummary, FunctionSummary, ModuleSummary

    def function(qualname: str, **facts) -> FunctionSummary:
        name = qualname.rsplit(".", 1)[-1]
        return FunctionSummary(qualname, name, "Net" if "." in qualname else None, (9, 0, 10, 0),
                               (), **facts)

    base = {"module": "m", "import_name": "m", "path": "m.py", "imports": {"build": "pkg.build"},
            "classes": {"Net": ClassSummary("Net", (1, 0, 8, 0), (), ())}}
    plain = ModuleSummary(**base).digest
    assert ModuleSummary(**base, functions={"helper": function("helper")}).digest == plain
    call = CallRecord("pkg.build", (9, 4, 9, 11), {})
    for loud in (function("build"), function("helper", facts=("eval_helper",)),
                 function("helper", calls=(call,)), function("Net.helper")):
        assert ModuleSummary(**base, functions={loud.qualname: loud}).digest != plain, loud


def test_the_summaries_and_marks_have_one_order_whatever_came_from_the_cache() -> None:
    """The store is iterated in module order, not in the order summaries came (the edited ones
    parsed, the others as cached text, a text parsed when asked for), and the index's marks
    are kept by kind in sorted order: a context is written the same on every run."""
    from bnfix.project.index import ProjectIndex
    from bnfix.project.modules import ModuleMap
    from bnfix.project.store import SummaryStore, summary_text
    from bnfix.project.summary import ModuleSummary

    def summary(module: str, kind: str) -> ModuleSummary:
        return ModuleSummary(module=module, import_name=module, path=f"{module}.py",
                             marks=((kind, (1, 0, 1, 5), None),))

    store = SummaryStore()
    store.add(summary("zeta", "arg_scope:tf.contrib.layers.batch_norm"))
    alpha = summary("alpha", "loads_weights")
    store.add_text("alpha", summary_text(alpha), alpha.digest)
    store.add(summary("mid", "eval_call"))
    assert list(store) == ["alpha", "mid", "zeta"]
    store["alpha"]  # parsed now: its place does not move
    assert list(store) == ["alpha", "mid", "zeta"]
    marks = ProjectIndex(store, ModuleMap.build([], Path("."))).project_marks()
    assert list(marks) == sorted(marks) and len(marks) == 3


def test_two_runs_writing_the_cache_at_once_keep_each_others_entries(tmp_path, monkeypatch):
    """A run re-reads the cache file before replacing it only when another process replaced it
    since the run read it (parallel pre-commit chunks): then both runs' entries are kept."""
    from bnfix.cache import Cache, Entry

    def entry(digest: str) -> Entry:
        return Entry(1, 2, digest, "ctx", True, None, None, None, None, None)

    first, second = Cache(tmp_path, "k" * 24), Cache(tmp_path, "k" * 24)
    first.put(tmp_path / "a.py", entry("a"))
    second.put(tmp_path / "b.py", entry("b"))
    first.save()
    second.save()  # read before `first` wrote: it merges
    merged = Cache(tmp_path, "k" * 24)
    assert {Path(p).name: e.digest for p, e in merged.entries.items()} == {"a.py": "a", "b.py": "b"}
    # nobody wrote the file since `merged` read it: it is written without being read again
    reads = []
    monkeypatch.setattr(Cache, "_load", lambda self: reads.append(1))
    merged.put(tmp_path / "c.py", entry("c"))
    merged.save()
    assert reads == []
    monkeypatch.undo()
    assert {Path(p).name for p in Cache(tmp_path, "k" * 24).entries} == {"a.py", "b.py", "c.py"}


def test_a_mark_added_in_a_file_nothing_imports_changes_the_cached_findings(tree):
    """What every file's check reads of the whole project (marks such as `load_state_dict`,
    the BN APIs built anywhere) is part of each file's cached-findings key: BN104's fix
    becomes display-only when the project starts loading trained weights, in a file the
    model file has nothing to do with (a warm run kept the stale fix before)."""
    model = ("import torch.nn as nn\n\n\nclass Net(nn.Module):\n    def __init__(self):\n"
             "        super().__init__()\n        self.conv = nn.Conv2d(3, 8, 3, bias=True)\n"
             "        self.bn = nn.BatchNorm2d(8)\n\n    def forward(self, x):\n"
             "        return self.bn(self.conv(x))\n")
    script = "import torch\n\n\ndef main(model):\n    return model\n"
    root = tree({"pyproject.toml": "[tool.bnfix]\n", "a.py": model, "b.py": script})

    def fixes(**options):
        return [(d.code, d.fix.applicability.value if d.fix else None)
                for d in _lint(root, extend_select=["BN104"], **options).remaining]

    assert fixes() == [("BN104", "unsafe")]
    (root / "b.py").write_text(script.replace("    return model",
                                              "    model.load_state_dict(torch.load('w.pt'))\n"
                                              "    return model"))
    assert fixes() == fixes(cache=False) == [("BN104", "display-only")]


def test_files_digest_follows_name_size_and_time_and_content_while_racy(tmp_path) -> None:
    """bnfix's code and rule files are digested by name, size and mtime (no read at start-up);
    a file modified within the racy window is digested by content too, so an edit that keeps
    both size and time still changes the digest."""
    from bnfix.cache import RACY_NS, files_digest

    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\n")
    b.write_text("y = 2\n")
    old = time.time_ns() - 10 * RACY_NS
    for path in (a, b):
        os.utime(path, ns=(old, old))

    def now() -> str:
        return files_digest([a, b], tmp_path)

    base = now()
    assert now() == base
    a.write_text("x = 3\n")  # same size, then the same time again: not seen once aged
    os.utime(a, ns=(old, old))
    assert now() == base
    os.utime(a, ns=(old + 1, old + 1))
    assert now() != base
    os.utime(a, ns=(old, old))
    a.write_text("x = 12\n")  # another size
    os.utime(a, ns=(old, old))
    assert now() != base
    a.write_text("x = 1\n")
    os.utime(a, ns=(old, old))
    assert now() == base
    # racy: modified just now, the content decides between two same-size, same-time edits
    fresh = time.time_ns()
    a.write_text("x = 4\n")
    os.utime(a, ns=(fresh, fresh))
    first = now()
    a.write_text("x = 5\n")
    os.utime(a, ns=(fresh, fresh))
    assert now() != first
    assert files_digest([a], tmp_path) != files_digest([b], tmp_path)  # the name counts
    b.unlink()
    assert now() != base  # a file gone counts, without an error


ZOO = """
import tensorflow as tf
import torch.nn as nn

layers = [nn.BatchNorm1d(4), nn.BatchNorm2d(4), nn.BatchNorm3d(4), nn.SyncBatchNorm(4),
          nn.LazyBatchNorm2d(), tf.keras.layers.BatchNormalization()]


def tf1(x):
    return tf.compat.v1.layers.batch_normalization(x, training=True)
"""


def test_project_contexts_are_written_the_same_by_every_process(tmp_path):
    """The context digests kept with the findings do not depend on the interpreter's string
    hashing (set order): two cold runs of each multi-file fixture, with other hash seeds,
    store the same digests."""
    import shutil

    fixtures = Path(__file__).resolve().parent.parent / "fixtures"
    for name in ("tf1_project", "torch_project"):
        root = tmp_path / name
        shutil.copytree(fixtures / name, root, ignore=shutil.ignore_patterns("fixed"))
        (root / "pyproject.toml").write_text("[tool.bnfix]\n")
        (root / "zoo.py").write_text(ZOO)  # BN APIs enough that a set of them has no one order
        stored = []
        for seed in ("1", "2"):
            shutil.rmtree(root / ".bnfix_cache", ignore_errors=True)
            run_bnfix("check", ".", cwd=root, env={"PYTHONHASHSEED": seed})
            (cache,) = (root / ".bnfix_cache").glob("*.jsonl")
            files = [json.loads(line.partition("\t")[0])  # the fields, then the summary
                     for line in cache.read_text().splitlines()[1:]]
            stored.append({Path(path).name: entry["findings"]["context"]
                           for path, entry in files if entry["findings"]})
        assert stored[0] == stored[1]
        assert sum(1 for digest in stored[0].values() if digest) >= 3, stored[0]


def test_a_run_without_the_cache_digests_no_context(tree, monkeypatch):
    """The contexts' digests are for the cache alone: `--no-cache` computes none."""
    from bnfix.project.view import FileContext

    _, _, checked, findings = _wrapper_project(tree, monkeypatch)
    digests: list[str] = []
    original = FileContext.digest
    monkeypatch.setattr(FileContext, "digest", lambda self: digests.append(self.path) or
                        original(self))
    assert findings(cache=False) and sorted(checked) == ["eval.py", "models/__init__.py",
                                                         "models/layers.py", "train.py"]
    assert digests == []
    findings()
    assert len(digests) == 4


def test_cache_files_of_other_keys_go_when_unused_for_two_weeks(tree):
    """Each bnfix upgrade (its code is in the key) or other rule selection starts a cache file;
    a run that writes its own removes the others no run has used for STALE_CACHE_SECONDS, and
    nothing else: not a recent one, not a file that is not a bnfix cache, not a link."""
    from bnfix.cache import STALE_CACHE_SECONDS

    root = tree({"pyproject.toml": "[tool.bnfix]\n", "a.py": BUGGY})
    _lint(root, select=["BN008"])
    folder = root / ".bnfix_cache"
    (own,) = folder.glob("*.jsonl")
    old = time.time() - STALE_CACHE_SECONDS - 3600
    header = json.dumps({"format": FORMAT, "meta": {}}, separators=(",", ":")) + "\n"
    files = {name: folder / name for name in (
        "0123456789abcdef01234567.jsonl",  # another key's, unused: removed
        "89abcdef0123456789abcdef.jsonl",  # another key's, used lately: kept
        "fedcba9876543210fedcba98.jsonl",  # named like one, not a cache: kept
        "notes.jsonl",  # the user's, in a --cache-dir they share: kept
    )}
    for name, path in files.items():
        path.write_text("user data\n" if name.startswith(("fedcba", "notes")) else header)
        if not name.startswith("89ab"):
            os.utime(path, (old, old))
    target = root / "elsewhere.jsonl"
    target.write_text(header)
    link = folder / "76543210fedcba9876543210.jsonl"
    link.symlink_to(target)
    os.utime(link, (old, old), follow_symlinks=False)
    (root / "a.py").write_text(BUGGY + "\n")  # a change: the run writes its cache
    _lint(root, select=["BN008"])
    left = sorted(p.name for p in folder.glob("*.jsonl"))
    assert left == sorted({own.name, link.name} | set(files) - {"0123456789abcdef01234567.jsonl"})
    assert target.exists()


def test_a_cache_file_read_is_marked_used(tree):
    """A key used only by warm runs (nothing changed, nothing written) is not taken for unused:
    a read sets the file's time, at most once a day."""
    from bnfix.cache import TOUCH_SECONDS

    root = tree({"pyproject.toml": "[tool.bnfix]\n", "a.py": BUGGY})
    hour_ago = time.time() - 3600
    os.utime(root / "a.py", (hour_ago, hour_ago))  # not racy: the next runs write nothing
    _lint(root)
    (own,) = (root / ".bnfix_cache").glob("*.jsonl")
    os.utime(own, (hour_ago, hour_ago))
    _lint(root)
    assert own.stat().st_mtime == hour_ago  # recent enough: not written for nothing
    week_ago = time.time() - 7 * TOUCH_SECONDS
    os.utime(own, (week_ago, week_ago))
    _lint(root)
    assert time.time() - own.stat().st_mtime < 60


def test_inspect_cache_files_of_other_keys_are_pruned_by_their_own_prefix(tmp_path):
    """`inspect`'s cache files (`inspect-<key>.json`) are pruned among themselves: check's
    files in the same folder are not theirs to remove, nor the reverse."""
    from bnfix.cache import STALE_CACHE_SECONDS, prune_other_keys

    old = time.time() - STALE_CACHE_SECONDS - 3600
    start = '{"format":1,"entries":{}}'
    paths = [tmp_path / n for n in ("inspect-0123456789abcdef01234567.json",
                                    "0123456789abcdef01234567.jsonl")]
    for path in paths:
        path.write_text(start)
        os.utime(path, (old, old))
    prune_other_keys(tmp_path / "inspect-89abcdef0123456789abcdef.json", "inspect-", ".json")
    assert [p.exists() for p in paths] == [False, True]
    prune_other_keys(tmp_path / "89abcdef0123456789abcdef.jsonl", "", ".jsonl")
    assert not paths[1].exists()


def test_names_a_star_import_binds_follow_the_star_imported_module(tree):
    """`from ..imports import *` binds the library names of the project's own `imports.py`
    (tsai): the model file's BN and conv are torch's through them, and an edit of `imports.py`
    alone (the model file unchanged, its findings cached) changes what the model file's names
    are."""
    model = ("from ..imports import *\n\n\nclass Block(nn.Module):\n"
             "    def __init__(self):\n        super().__init__()\n"
             "        self.conv = nn.Conv1d(3, 8, 3)\n        self.bn = nn.BatchNorm1d(8)\n\n"
             "    def forward(self, x):\n        return self.bn(self.conv(x))\n")
    root = tree({"pyproject.toml": "[tool.bnfix]\n", "pkg/__init__.py": "",
                 "pkg/imports.py": "import torch\nimport torch.nn as nn\n",
                 "pkg/models/__init__.py": "", "pkg/models/block.py": model})

    def found(**options):
        return [(d.code, Path(d.path).relative_to(root).as_posix(), d.span.start.row)
                for d in _lint(root, extend_select=["BN104"], **options).remaining]

    assert found() == found() == found(cache=False) == [("BN104", "pkg/models/block.py", 7)]
    (root / "pkg/imports.py").write_text("import torch\nimport torch_geometric.nn as nn\n")
    assert found() == found(cache=False) == []
