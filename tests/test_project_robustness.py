"""The project pass on awkward projects: import cycles, star imports, a module imported under two
names, files that do not parse, two files with one module name, re-exports nested too deep, and
a large tree — no crash, no hang, findings where they belong, a note where analysis gave up."""

from __future__ import annotations

from pathlib import Path

from conftest import Run, run_bnfix, write_tree

from bnfix import check_paths

BN = "import tensorflow.compat.v1 as tf\n"


def rows(root: Path, select: list[str]) -> set[tuple[str, str, int]]:
    report = check_paths([root], select=select)
    return {(Path(d.path).relative_to(root).as_posix(), d.code, d.span.start.row)
            for d in report.remaining}


def test_import_cycle_and_recursion_terminate(tmp_path: Path):
    write_tree(tmp_path, {
        "a.py": BN + "from b import f\n\n\ndef g(x, t=False):\n    return f(x, t)\n",
        "b.py": BN + "from a import g\n\n\ndef f(x, t):\n"
                "    y = tf.layers.batch_normalization(x, training=True, trainable=t)\n"
                "    return g(y, t)\n",
        "train.py": "from a import g\n\nnet = g(images)\n",
    })
    # the default False of a.g reaches b.f's BN in training mode: reported where it is
    # written, whatever the cycle
    assert rows(tmp_path, ["BN001"]) == {("a.py", "BN001", 5)}


def test_star_imports_and_reexports_resolve(tmp_path: Path):
    write_tree(tmp_path, {
        "nets/__init__.py": "from .layers import *\n",
        "nets/layers.py": BN + "\n\ndef conv_bn(x, is_training, trainable=True):\n"
                          "    return tf.layers.batch_normalization(x, training=is_training, "
                          "trainable=trainable)\n",
        "train.py": "from nets import conv_bn\n\nnet = conv_bn(images, True, trainable=False)\n",
    })
    assert rows(tmp_path, ["BN001"]) == {("train.py", "BN001", 3)}


def test_a_wrapper_reexported_under_another_name_is_followed(tmp_path: Path):
    """`from nets import conv_bn as cb` in a package's `__init__`: a script that calls `cb`
    never names `conv_bn`, and is still analysed with the project."""
    write_tree(tmp_path, {
        "nets/__init__.py": "from .layers import conv_bn\n",
        "nets/layers.py": BN + "\n\ndef conv_bn(x, is_training, trainable=True):\n"
                          "    return tf.layers.batch_normalization(x, training=is_training, "
                          "trainable=trainable)\n",
        "models/__init__.py": "from nets import conv_bn as cb\n",
        "train.py": "from models import cb\n\nnet = cb(images, True, trainable=False)\n",
    })
    assert rows(tmp_path, ["BN001"]) == {("train.py", "BN001", 3)}


def test_one_module_under_two_names(tmp_path: Path):
    layers = BN + "\n\ndef bn(x, is_training, trainable=True):\n" \
                  "    return tf.layers.batch_normalization(x, training=is_training, trainable=trainable)\n"
    write_tree(tmp_path, {
        "src/pkg/__init__.py": "",
        "src/pkg/layers.py": layers,
        "src/pkg/train.py": "from layers import bn\n\na = bn(x, True, trainable=False)\n",
        "tools/export.py": "from pkg.layers import bn\n\nb = bn(x, True, trainable=False)\n",
    })
    assert rows(tmp_path, ["BN001"]) == {("src/pkg/train.py", "BN001", 3),
                                         ("tools/export.py", "BN001", 3)}


def test_a_file_that_does_not_parse_leaves_the_rest_analysed(tmp_path: Path):
    write_tree(tmp_path, {
        "models/broken.py": BN + "y = tf.layers.batch_normalization(\ndef f(:\n",
        "models/net.py": BN + "\n\ndef net(x, t, trainable=False):\n"
                         "    return tf.layers.batch_normalization(x, training=t, trainable=trainable)\n",
        "train.py": "from models.broken import f\nfrom models.net import net\n\ny = net(x, True)\n",
    })
    assert rows(tmp_path, ["BN001", "BN900"]) == {("models/broken.py", "BN900", 3),
                                                  ("models/net.py", "BN001", 5)}


def test_two_scripts_with_sibling_modules_of_one_name(tmp_path: Path):
    net = BN + "\n\ndef build(x, t, trainable={}):\n" \
               "    return tf.layers.batch_normalization(x, training=t, trainable=trainable)\n"
    write_tree(tmp_path, {
        "exp1/net.py": net.format("False"),
        "exp1/train.py": "from net import build\n\ny = build(x, True)\n",
        "exp2/net.py": net.format("True"),
        "exp2/train.py": "from net import build\n\ny = build(x, True)\n",
    })
    assert rows(tmp_path, ["BN001"]) == {("exp1/net.py", "BN001", 5)}


def _chain(tmp_path: Path, module: str, default: bool, passed: str) -> Run:
    """Twelve modules (`module` formats `p{i}`) each importing `thing` from the next, the last
    building a BN with `trainable=default`; `main.py` calls `thing(x<passed>)`."""
    files = {module.format(f"p{i}"): f"from p{i + 1} import thing\n" for i in range(12)}
    files[module.format("p12")] = BN + f"\n\ndef thing(x, trainable={default}):\n" \
        "    return tf.layers.batch_normalization(x, training=True, trainable=trainable)\n"
    files["main.py"] = f"from p0 import thing\n\ny = thing(x{passed})\n"
    write_tree(tmp_path, files)
    return run_bnfix("check", "--no-cache", "--select", "BN001", ".", cwd=tmp_path)


def test_reexports_nested_too_deep_give_a_note(tmp_path: Path):
    """Packages re-exporting a name through more `__init__.py` files than the index follows
    (each package is summarised: its re-exports are how imports resolve)."""
    run = _chain(tmp_path, "{}/__init__.py", False, "")
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert "project analysis gave up" in run.stderr and "re-exports nested deeper" in run.stderr


def test_names_given_on_through_too_many_files_give_a_note(tmp_path: Path):
    """Plain modules each importing the name from the next: each round of the name search
    finds one more file (a file is read when it names a module that gives a BN builder and
    the builder), and the rounds run out before `main.py`, which passes the False."""
    run = _chain(tmp_path, "{}.py", True, ", trainable=False")
    assert run.returncode == 0 and "Traceback" not in run.stderr
    assert "project analysis gave up: BN code reached through more than 8 files" in run.stderr
    # a chain of six files is followed to its end
    for i in range(5, 12):
        (tmp_path / f"p{i}.py").unlink()
    (tmp_path / "p4.py").write_text("from p12 import thing\n")
    run = run_bnfix("check", "--no-cache", "--select", "BN001", ".", cwd=tmp_path)
    assert "gave up" not in run.stderr and "Traceback" not in run.stderr
    assert run.returncode == 1 and run.stdout.startswith("main.py:3:24: BN001"), run.stdout


def test_a_large_tree_finishes(tmp_path: Path):
    files = {f"pkg{i // 100}/mod{i}.py": f"VALUE_{i} = {i}\n\n\ndef f{i}(x):\n    return x + {i}\n"
             for i in range(5000)}
    files["pkg0/__init__.py"] = ""
    files["pkg0/net.py"] = BN + "\n\ndef net(x, t, trainable=False):\n" \
                                "    return tf.layers.batch_normalization(x, training=t, trainable=trainable)\n"
    files["train.py"] = "from pkg0.net import net\n\ny = net(x, True)\n"
    write_tree(tmp_path, files)
    run = run_bnfix("check", "--no-cache", "--output-format", "concise", ".", cwd=tmp_path,
                    timeout=600)
    assert run.returncode == 1, run.stderr
    assert run.stdout.splitlines()[0].startswith("pkg0/net.py:5:")


def test_the_garbage_collector_is_paused_for_a_run_and_restored(tmp_path: Path,
                                                                  monkeypatch) -> None:
    """The run pauses CPython's cyclic collector (it scanned the run's millions of long-lived
    objects again and again) and gives it back as it found it: after a run, after an
    interrupted one, and left off when the caller had it off."""
    import gc

    from bnfix.project import session

    write_tree(tmp_path, {"a.py": BN + "y = tf.layers.batch_normalization(x, training=True, "
                                       "trainable=False)\n"})
    during = []
    summarise = session.Worker.summarise

    def watched(self, *args, **kwargs):
        during.append(gc.isenabled())
        return summarise(self, *args, **kwargs)

    monkeypatch.setattr(session.Worker, "summarise", watched)
    assert gc.isenabled()
    assert rows(tmp_path, ["BN001"]) == {("a.py", "BN001", 2)}
    assert during and not any(during)
    assert gc.isenabled()

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(session.Worker, "summarise", interrupted)
    try:
        check_paths([tmp_path], select=["BN001"])
    except KeyboardInterrupt:
        pass
    assert gc.isenabled()
    gc.disable()
    try:
        monkeypatch.setattr(session.Worker, "summarise", watched)
        rows(tmp_path, ["BN001"])
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_callers_read_from_the_modules_that_reach_a_module_are_all_its_callers(
        tmp_path: Path, monkeypatch) -> None:
    """`ProjectIndex.callers` reads only the modules that can reach the callee's module (the
    dependency graph's edges, from the cache on a warm run): on the fixtures and on a project
    that calls through `__init__` re-exports, a star import, a two-hop re-export and an
    inherited method, every answer equals the one from reading every module, cold and warm
    after an edit."""
    import shutil

    from conftest import REPO

    from bnfix.project.index import ProjectIndex

    original = ProjectIndex.callers
    compared: list[tuple[str, str, int]] = []

    def both(self: ProjectIndex, module: str, qualname: str):
        got = original(self, module, qualname)
        if self.dependents is not None:  # each answer alone, from fresh indexes
            alone = ProjectIndex(self.summaries, self.modules)
            alone.dependents = self.dependents
            every = ProjectIndex(self.summaries, self.modules)
            assert got == original(alone, module, qualname) == original(every, module, qualname), \
                (module, qualname)
            compared.append((module, qualname, len(got)))
        return got

    monkeypatch.setattr(ProjectIndex, "callers", both)
    monkeypatch.chdir(tmp_path)  # the cache is written in the configuration's root: here
    for fixture in ("tf1_project", "torch_project"):
        shutil.copytree(REPO / "fixtures" / fixture, tmp_path / fixture)
        check_paths([tmp_path / fixture])
    project = tmp_path / "project"
    write_tree(project, {
        "nets/__init__.py": "from .blocks import conv_bn\nfrom .base import *\n",
        "nets/blocks.py": BN + "\n\ndef conv_bn(x, is_training, trainable=True):\n"
                          "    return tf.layers.batch_normalization(x, training=is_training, "
                          "trainable=trainable)\n",
        "nets/base.py": "from .blocks import conv_bn\n\n__all__ = ['Base']\n\n\nclass Base:\n"
                        "    def block(self, x, t):\n        return conv_bn(x, t, trainable=False)\n",
        "models/__init__.py": "from nets import conv_bn\n",
        "models/net.py": "from nets import Base\n\n\nclass Net(Base):\n"
                         "    def __call__(self, x):\n        return self.block(x, True)\n",
        "nets/other.py": BN + "\n\ndef conv_bn(x, is_training, trainable=True):\n"
                         "    return tf.layers.batch_normalization(x, training=is_training, "
                         "trainable=trainable)\n",
        "train.py": "import models\nfrom models.net import Net\n\n"
                    "net = models.conv_bn(images, True, trainable=False)\nout = Net()(images)\n",
    })
    check_paths([project], cache=True)
    # warm, after the package re-exports `conv_bn` from the other module: train.py and
    # models/__init__.py are unchanged and their cached edges name nets.blocks; the call in
    # train.py now reaches nets.other through the re-exports (edges models -> nets -> other)
    (project / "nets" / "__init__.py").write_text(
        "from .other import conv_bn\nfrom .base import *\n")
    compared.clear()
    report = check_paths([project], cache=True)
    assert ("nets.other", "conv_bn", 1) in compared
    assert any(d.path.endswith("train.py") and d.code == "BN001" for d in report.remaining)


def test_the_name_search_after_an_edit_recomputes_what_reaches_it_and_equals_a_whole_search(
        tmp_path: Path, monkeypatch) -> None:
    """A warm run computes again only the name-search parts of the modules that reach a
    changed summary (names.py); after each edit (a new wrapper, a module that starts to reach
    BN, a script that then uses it and is summarised in a second round, BN removed) the names
    equal those of a search over every module, and a module that reaches nothing edited is
    never computed again."""
    from bnfix.project import names
    from bnfix.project.index import ProjectIndex
    from bnfix.project.runner import ProjectRunner

    computed: list[set[str]] = []
    contributions, original = names.contributions, ProjectRunner._names

    def recording(index, modules, digests, known):
        computed.append(set(modules))
        return contributions(index, modules, digests, known)

    def compared(self, project, plans):
        got = original(self, project, plans)
        if self._bn_names is not None:
            every = contributions(ProjectIndex(self.store, self._modules), list(self.store),
                                  {}, {})  # the unrecorded search over every module
            whole = {pair for part in every.values() for pair in part.pairs}
            assert {(t, n) for n, tails in self._bn_names for t in tails} == whole
            assert {(t, n) for n, tails in got for t in tails} == whole
        return got

    monkeypatch.setattr(names, "contributions", recording)
    monkeypatch.setattr(ProjectRunner, "_names", compared)
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)  # the cache is written in the configuration's root: here
    write_tree(project, {
        "models/__init__.py": "from .layers import conv_bn as cb\n",
        "models/layers.py": BN + "\n\ndef conv_bn(x, is_training, trainable=True):\n"
                            "    return tf.layers.batch_normalization(x, training=is_training, "
                            "trainable=trainable)\n",
        "models/net.py": "from models.layers import conv_bn\n\n\nclass Net:\n"
                         "    def __init__(self, t):\n        self.t = t\n\n"
                         "    def __call__(self, x):\n        return conv_bn(x, self.t)\n",
        "data/augment.py": BN + "\n\ndef norm(x):\n"
                           "    return tf.layers.batch_normalization(x, training=True)\n",
        "utils/misc.py": "import models.layers as layers\n\n\ndef helper(x):\n    return x\n",
        "train.py": "from models.net import Net\nimport models\n\n"
                    "out = Net(True)(images)\ny = models.cb(images, True, trainable=False)\n",
        "scripts/run.py": "from utils import misc\n\nz = misc.helper(images, True)\n",
    })

    def edit(path: str, text: str) -> set[str]:
        (project / path).write_text(text)
        computed.clear()
        check_paths([project], cache=True)
        return set().union(*computed)

    check_paths([project], cache=True)
    assert "data.augment" in set().union(*computed)
    # a second wrapper in the model file that nothing calls: its part alone (its users'
    # parts cannot see a function they do not name); one that models/__init__.py re-exports:
    # its users' parts again, never data.augment's
    again = edit("models/layers.py", (project / "models/layers.py").read_text()
                 + "\n\ndef bn_only(x):\n    return tf.layers.batch_normalization(x)\n")
    assert again == {"models.layers"}
    (project / "models/__init__.py").write_text("from .layers import conv_bn as cb\n"
                                                "from .layers import bn_twice as b2\n")
    again = edit("models/layers.py", (project / "models/layers.py").read_text()
                 + "\n\ndef bn_twice(x):\n    return bn_only(bn_only(x))\n")
    assert {"models.layers", "models.net", "models"} <= again and "data.augment" not in again
    # utils.misc starts to reach BN: `helper` becomes a name, and scripts/run.py, which calls
    # it, is found by the search, summarised and checked: the False it passes freezes the BN
    edit("utils/misc.py", "import models.layers as layers\n\n\ndef helper(x, t=True):\n"
                          "    return layers.conv_bn(x, True, trainable=t)\n")
    (project / "scripts/run.py").write_text("from utils import misc\n\nz = misc.helper(images, False)\n")
    report = check_paths([project], cache=True)
    assert any(d.path.endswith("run.py") and d.code == "BN001" for d in report.remaining)
    # BN removed from the wrapper: the names shrink as a whole search says
    again = edit("models/layers.py", "def conv_bn(x, is_training, trainable=True):\n    return x\n")
    assert "data.augment" not in again
    # a corrupt part in the cache is as none: everything is computed again
    (cache_file,) = (project / ".bnfix_cache").glob("*.jsonl")
    import json
    head, rest = cache_file.read_text().split("\n", 1)
    data = json.loads(head)
    data["meta"]["name_parts"] = '{"models": ["x", "abc", [1]]}'
    data["meta"]["names_for"] = "stale"
    cache_file.write_text(json.dumps(data) + "\n" + rest)
    computed.clear()
    check_paths([project], cache=True)
    assert "data.augment" in set().union(*computed)


def test_name_search_parts_read_back_only_when_well_formed() -> None:
    from bnfix.project import names

    part = names.Contribution("d", frozenset({("net", "Net")}))
    assert names.from_text(names.to_text({"models.net": part})) == {"models.net": part}
    for text in ("", "[]", "{\"m\": 1}", "{\"m\": [\"d\", \"ab\"]}",
                 "{\"m\": [\"d\", [[\"a\"]]]}", "{\"m\": [\"d\", [1]]}",
                 "{\"m\": [\"d\", [], []]}"):
        assert names.from_text(text) == {}, text


def test_the_project_root_is_walked_once(tmp_path: Path, monkeypatch):
    """`bnfix check .`: the walk that finds the files to report is the project's walk (a tenth
    of a warm run on a tree of 15,000 entries was the second one). Checking a subfolder still
    walks the root for the project around it, and reads each ignore file once for both walks."""
    import os

    import bnfix.files

    write_tree(tmp_path, {
        ".git/HEAD": "ref: refs/heads/main\n",
        "nets/layers.py": BN + "\n\ndef conv_bn(x, is_training, trainable=True):\n"
                          "    return tf.layers.batch_normalization(x, training=is_training, "
                          "trainable=trainable)\n",
        "scripts/train.py": "from nets.layers import conv_bn\n\n"
                            "net = conv_bn(images, True, trainable=False)\n",
        "data/readme.txt": "not Python\n",
        ".gitignore": "data/\n",
        "scripts/.gitignore": "old_*.py\n",
        "scripts/old_train.py": "from nets.layers import conv_bn\n\n"
                                "net = conv_bn(images, True, trainable=False)\n",
    })
    walks: list[str] = []  # the folders walks start from (a walk goes down by itself)
    original = bnfix.files._walk
    reads: list[str] = []  # the ignore files read (each existing one parsed when read)
    read = bnfix.files._read_gitignore

    def counted(shown, folder, *args):
        walks.append(os.path.relpath(folder, tmp_path))
        return original(shown, folder, *args)

    def read_counted(path, notes):
        reads.append(os.path.relpath(path, tmp_path))
        return read(path, notes)

    monkeypatch.setattr(bnfix.files, "_walk", counted)
    monkeypatch.setattr(bnfix.files, "_read_gitignore", read_counted)
    assert rows(tmp_path, ["BN001"]) == {("scripts/train.py", "BN001", 3)}
    assert walks == ["."]
    walks.clear()
    reads.clear()
    report = check_paths([tmp_path / "scripts"], select=["BN001"])  # the wrapper is outside
    assert [(Path(d.path).name, d.span.start.row) for d in report.remaining] == [("train.py", 3)]
    assert walks == ["scripts", "."]  # the folder asked about, then the project's
    assert sorted(reads) == sorted(set(reads))  # each once, though both walks met them
    assert {".gitignore", "scripts/.gitignore"} <= set(reads)


def test_module_ids_are_dotted_paths_from_the_project_root(tmp_path: Path):
    """A file's module id is its dotted path from the root; a file outside the root (named on
    the command line: a sibling folder whose name starts like the root's, a parent's file)
    keeps its import name; names that are not identifiers make no dotted path."""
    from bnfix.project.modules import ModuleMap

    files = ["proj/pkg/__init__.py", "proj/pkg/net.py", "proj/tools/run.py", "proj/my-tool.py",
             "projx/pkg/__init__.py", "projx/pkg/other.py", "top.py"]
    write_tree(tmp_path, {name: "" for name in files})
    modules = ModuleMap.build([tmp_path / name for name in files], tmp_path / "proj")
    names = {Path(p).relative_to(tmp_path).as_posix(): (m.name, m.import_name)
             for p, m in modules.by_path.items()}
    assert names == {"proj/pkg/__init__.py": ("pkg", "pkg"),
                     "proj/pkg/net.py": ("pkg.net", "pkg.net"),
                     "proj/tools/run.py": ("tools.run", "run"),
                     "proj/my-tool.py": ("my-tool", "my-tool"),
                     "projx/pkg/__init__.py": ("pkg", "pkg"),
                     "projx/pkg/other.py": ("pkg.other", "pkg.other"), "top.py": ("top", "top")}
    # a namespace folder under the root resolves to its dotted path
    found = modules.resolve("tools.run", None)
    assert found is not None and found[0].name == "tools.run"


def test_module_names_follow_the_package_chain_whatever_the_order_asked():
    """module_name shares each folder's package name between the files asked about: the same
    answer as walking up from every file alone, in any order, and no recursion on a tree
    3,000 packages deep."""
    import os
    import random

    from bnfix.project.modules import module_name

    def walking_up(path: str, files: set[str]) -> tuple[str, str]:
        folder, base = os.path.split(path)
        parts = [] if base == "__init__.py" else [base[:-3]]
        while os.path.join(folder, "__init__.py") in files and os.path.dirname(folder) != folder:
            folder, name = os.path.split(folder)
            parts.append(name)
        return ".".join(reversed(parts)), folder

    rng = random.Random(7)
    for _ in range(200):
        files = {"/" + "/".join([*(rng.choice("ab") for _ in range(rng.randint(0, 4))),
                                 rng.choice(["__init__.py", "m.py"])])
                 for _ in range(rng.randint(1, 30))}
        shared: dict[str, tuple[str, str]] = {}
        for path in rng.sample(sorted(files), len(files)):
            assert module_name(path, files, shared) == walking_up(path, files), (path, files)
    deep = "".join(f"/p{i}" for i in range(3000))
    files = {deep[:deep.index(f"/p{i}") + len(f"/p{i}")] + "/__init__.py" for i in range(3000)}
    files.add(deep + "/net.py")
    name, root = module_name(deep + "/net.py", files)
    assert root == "/" and name.count(".") == 3000 and name.endswith("p2999.net")


def test_a_network_of_hundreds_of_bn_reached_through_both_branches_is_followed(tmp_path: Path):
    """pretrained-models' `nasnetalarge()` builds NASNet-A Large (264 BN) in both branches
    of `if pretrained:`: 528 BN call sites reached from one function, and no note."""
    cells = "".join(f"    x = bn(x, {i})\n" for i in range(264))
    write_tree(tmp_path, {
        "nets.py": BN + "\n\ndef bn(x, i, trainable=False):\n"
                   "    return tf.layers.batch_normalization(x, training=True, trainable=trainable)\n"
                   "\n\ndef large(x):\n" + cells + "    return x\n"
                   "\n\ndef nasnetalarge(x, pretrained=False):\n"
                   "    if pretrained:\n        return large(x)\n    return large(x)\n",
        "main.py": "from nets import nasnetalarge\n\ny = nasnetalarge(x)\n",
    })
    run = run_bnfix("check", "--no-cache", "--select", "BN001", ".", cwd=tmp_path)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert "gave up" not in run.stderr


def test_the_note_on_modules_of_one_name_counts_the_files(tmp_path: Path):
    net = BN + "\n\ndef build(x, t):\n    return tf.layers.batch_normalization(x, training=t)\n"
    files = {f"exp-{i}/net.py": net for i in range(3)}  # folders that are no package names
    files.update({f"exp-{i}/train.py": "from net import build\n\ny = build(x, True)\n"
                  for i in range(3)})
    write_tree(tmp_path, files)
    run = run_bnfix("check", "--no-cache", ".", cwd=tmp_path)
    assert "three files are module `net`" in run.stderr, run.stderr


def test_many_module_names_of_several_files_make_one_note(tmp_path: Path):
    """TensorFlow-Examples holds its examples twice (`examples/3_NeuralNetworks/gan.py` and
    `tensorflow_v1/examples/3_NeuralNetworks/gan.py`): 32 names, one line, not 32."""
    stems = [f"example_{i}" for i in range(6)]
    files = {f"{copy}/1_Intro/{stem}.py": "x = 1\n" for copy in ("v2", "v1") for stem in stems}
    write_tree(tmp_path, files)
    run = run_bnfix("check", "--no-cache", ".", cwd=tmp_path)
    notes = [line for line in run.stderr.splitlines() if "claimed by several files" in line]
    assert len(notes) == 1 and "are module" not in run.stderr, run.stderr
    assert notes[0].startswith("bnfix: 6 module names are each claimed by several files "
                               "(`example_0`: v1/1_Intro/example_0.py, v2/1_Intro/example_0.py;")
    assert "`example_2`" in notes[0] and "`example_3`" not in notes[0]
    assert "and 3 more): imports of them are resolved from each importer's own folder first" \
        in notes[0]
    # a name that many files claim: three of them named, the others counted
    write_tree(tmp_path, {f"copy-{i}/1_Intro/example_0.py": "x = 1\n" for i in range(5)})
    run = run_bnfix("check", "--no-cache", ".", cwd=tmp_path)
    assert "`example_0`: copy-0/1_Intro/example_0.py, copy-1/1_Intro/example_0.py, " \
           "copy-2/1_Intro/example_0.py and 4 more; `example_1`" in run.stderr, run.stderr


def test_sibling_folders_that_are_no_package_names_keep_each_file_its_own_summary(tmp_path: Path):
    """TensorFlow-2.x-Tutorials: `06-CIFAR-VGG/main.py` and `07-Inception/main.py` are both
    module `main` to a script run from its folder; each is still analysed against its own
    summary and its own folder's `model.py`."""
    keras = "import tensorflow as tf\n"
    write_tree(tmp_path, {
        "exp-0/model.py": keras + "\n\ndef block(x, momentum):\n"
                          "    return tf.keras.layers.BatchNormalization(momentum=momentum)(x)\n",
        "exp-0/main.py": "from model import block\n\ny = block(x, 0.1)\n",
        "exp-1/model.py": keras + "\n\ndef block(x, momentum):\n"
                          "    return tf.keras.layers.BatchNormalization(momentum=momentum)(x)\n",
        "exp-1/main.py": "from model import block\n\n\n\nz = block(x, 0.99)\ny = block(x, 0.1)\n",
    })
    found = {(Path(d.path).relative_to(tmp_path).as_posix(), d.code, d.span.start.row)
             for d in check_paths([tmp_path], select=["BN008"]).remaining}
    assert found == {("exp-0/main.py", "BN008", 3), ("exp-1/main.py", "BN008", 6)}
