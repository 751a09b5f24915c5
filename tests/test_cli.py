"""The command line, run as a subprocess on real files: formats, exit codes, fixing,
configuration, discovery, bad input, and what the lint path must never do."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
from conftest import run_bnfix

BUGGY = '''
import tensorflow as tf

def bn(x, training, trainable=False):
    return tf.layers.batch_normalization(x, training=training, trainable=trainable)

net = bn(images, training=True)
ema = tf.train.ExponentialMovingAverage(0.99)
op = ema.apply(tf.global_variables())
'''
CLEAN = '''
import tensorflow as tf

net = tf.layers.batch_normalization(images, training=True)
with tf.control_dependencies(tf.get_collection(tf.GraphKeys.UPDATE_OPS)):
    train_op = opt.minimize(loss)
'''


def test_clean_tree_exits_0(tree):
    root = tree({"clean.py": CLEAN, "notes.txt": "batch_norm"})
    run = run_bnfix("check", str(root))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "All checks passed!" in run.stdout


def test_findings_exit_1_with_full_output(tree):
    root = tree({"pkg/train.py": BUGGY, "clean.py": CLEAN})
    run = run_bnfix("check", "pkg", cwd=root)
    assert run.returncode == 1
    assert "pkg/train.py:4:64: BN001" in run.stdout
    assert "pkg/train.py:8:6: BN004" in run.stdout
    assert "^^^^" in run.stdout and "= help:" in run.stdout
    assert "Found 2 errors." in run.stdout
    assert "2 unsafe fixes available with `--fix --unsafe-fixes`." in run.stdout  # ruff 0.17's words


def test_exit_zero_and_concise(tree):
    root = tree({"train.py": BUGGY})
    run = run_bnfix("check", "--exit-zero", "--output-format", "concise", "train.py", cwd=root)
    assert run.returncode == 0
    assert run.stdout.splitlines()[0].startswith("train.py:4:64: BN001 ")


def test_json_records_have_ruffs_shape(tree):
    root = tree({"train.py": BUGGY})
    run = run_bnfix("check", "--output-format", "json", "train.py", cwd=root)
    assert run.returncode == 1
    records = json.loads(run.stdout)
    assert [r["code"] for r in records] == ["BN001", "BN004"]
    first = records[0]
    assert set(first) >= {"code", "name", "filename", "location", "end_location", "message",
                          "url", "fix"}
    assert first["name"] == "frozen-affine-in-training"
    assert first["filename"] == str((root / "train.py").resolve())
    assert first["location"] == {"row": 4, "column": 64}
    assert first["fix"]["applicability"] == "unsafe"
    assert first["fix"]["edits"] == [{"content": "True", "location": {"row": 3, "column": 31},
                                      "end_location": {"row": 3, "column": 36}}]


def test_sarif_is_sarif_2_1_0(tree):
    root = tree({"train.py": BUGGY})
    run = run_bnfix("check", "--output-format", "sarif", "train.py", cwd=root)
    log = json.loads(run.stdout)
    assert log["version"] == "2.1.0" and "sarif-2.1.0" in log["$schema"]
    (sarif_run,) = log["runs"]
    driver = sarif_run["tool"]["driver"]
    assert driver["name"] == "bnfix" and driver["version"]
    rule_ids = [r["id"] for r in driver["rules"]]
    for result in sarif_run["results"]:
        assert rule_ids[result["ruleIndex"]] == result["ruleId"]
        assert result["level"] in ("error", "warning", "note", "none")
        assert result["message"]["text"]
        region = result["locations"][0]["physicalLocation"]["region"]
        assert region["startLine"] >= 1 and region["startColumn"] >= 1
        assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "train.py"
        for fix in result.get("fixes", []):
            for change in fix["artifactChanges"]:
                for repl in change["replacements"]:
                    assert repl["deletedRegion"]["startLine"] >= 1
                    assert "text" in repl["insertedContent"]


def test_github_annotations(tree):
    root = tree({"train.py": BUGGY})
    run = run_bnfix("check", "--output-format", "github", "train.py", cwd=root)
    assert run.stdout.splitlines()[0].startswith(
        "::error title=bnfix (BN001),file=train.py,line=4,col=64,endLine=")


def test_statistics(tree):
    root = tree({"a.py": BUGGY, "b.py": BUGGY})
    run = run_bnfix("check", "--statistics", ".", cwd=root)
    assert run.returncode == 1
    assert "2\tBN001\tfrozen-affine-in-training" in run.stdout  # no [*] column: nothing applies
    run = run_bnfix("check", "--statistics", "--unsafe-fixes", ".", cwd=root)
    assert "2\tBN004\t[*] double-ema-of-bn-stats" in run.stdout


def test_diff_writes_nothing(tree):
    root = tree({"train.py": BUGGY})
    before = (root / "train.py").read_bytes()
    run = run_bnfix("check", "--diff", "--unsafe-fixes", "train.py", cwd=root)
    assert run.returncode == 1
    assert "-def bn(x, training, trainable=False):" in run.stdout
    assert "+op = ema.apply(tf.trainable_variables())" in run.stdout
    assert run.stdout.endswith("Would fix 2 errors.\n")  # after the diff, as ruff 0.17 prints it
    assert (root / "train.py").read_bytes() == before


def test_fix_writes_unsafe_only_when_asked_and_keeps_mode(tree):
    root = tree({"train.py": BUGGY})
    path = root / "train.py"
    path.chmod(0o640)
    run = run_bnfix("fix", "train.py", cwd=root)
    assert run.returncode == 1 and path.read_text() == BUGGY.lstrip("\n")
    run = run_bnfix("check", "--fix", "--unsafe-fixes", "train.py", cwd=root)
    assert run.returncode == 0, run.stdout
    assert "Found 2 errors (2 fixed, 0 remaining)." in run.stdout
    assert "trainable=True" in path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert not [p for p in root.iterdir() if p.name.endswith(".bnfix")], "no temporary left"
    again = run_bnfix("fix", "--unsafe-fixes", "train.py", cwd=root)
    assert again.returncode == 0 and "All checks passed!" in again.stdout


def test_fix_through_a_symlink_keeps_the_link(tree):
    root = tree({"real/train.py": BUGGY})
    (root / "link.py").symlink_to(root / "real" / "train.py")
    run = run_bnfix("fix", "--unsafe-fixes", "link.py", cwd=root)
    assert run.returncode == 0
    assert (root / "link.py").is_symlink()
    assert "trainable=True" in (root / "real" / "train.py").read_text()


def test_stdin(tree):
    run = run_bnfix("check", "--stdin-filename", "model.py", "--output-format", "concise",
                    stdin=BUGGY.lstrip("\n"))
    assert run.returncode == 1 and run.stdout.startswith("model.py:4:64: BN001")
    fixed = run_bnfix("check", "-", "--fix", "--unsafe-fixes", stdin=BUGGY.lstrip("\n"))
    assert fixed.returncode == 0
    assert "trainable=True" in fixed.stdout and "Found 2 errors (2 fixed" in fixed.stderr


def test_select_ignore_extend_select_on_the_command_line(tree):
    root = tree({"train.py": BUGGY})
    only = run_bnfix("check", "--select", "BN004", "--output-format", "concise", ".", cwd=root)
    assert [line.split()[1] for line in only.stdout.splitlines()[:-2]] == ["BN004"]
    ignored = run_bnfix("check", "--ignore", "BN0", ".", cwd=root)
    assert ignored.returncode == 0
    extended = run_bnfix("check", "--select", "BN900", "--extend-select", "BN001", "--output-format",
                         "concise", ".", cwd=root)
    assert "BN001" in extended.stdout and "BN004" not in extended.stdout
    bad = run_bnfix("check", "--select", "XYZ1", ".", cwd=root)
    assert bad.returncode == 2 and "unknown rule selector `XYZ1`" in bad.stderr


def test_pyproject_configuration(tree):
    root = tree({
        "pyproject.toml": """
            [tool.bnfix]
            ignore = ["BN004"]
            per-file-ignores = {"legacy/*.py" = ["BN001"]}
            extend-exclude = ["generated"]
        """,
        "src/train.py": BUGGY,
        "legacy/old.py": BUGGY,
        "generated/gen.py": BUGGY,
    })
    run = run_bnfix("check", "--output-format", "concise", ".", cwd=root)
    lines = [line for line in run.stdout.splitlines() if ": BN" in line]
    assert lines == [line for line in lines if line.startswith("src/train.py")]
    assert [line.split()[1] for line in lines] == ["BN001"]
    explicit = run_bnfix("check", "generated/gen.py", cwd=root)
    assert explicit.returncode == 1, "a file named on the command line is checked"
    forced = run_bnfix("check", "--force-exclude", "generated/gen.py", cwd=root)
    assert forced.returncode == 0


def test_bad_configuration_is_a_usage_error(tree):
    root = tree({"pyproject.toml": "[tool.bnfix]\nselekt = ['BN001']\n", "a.py": BUGGY})
    run = run_bnfix("check", ".", cwd=root)
    assert run.returncode == 2
    assert "[tool.bnfix] unknown key `selekt` (did you mean `select`?)" in run.stderr




def test_gitignore_is_respected(tree):
    root = tree({".gitignore": "ignored/\n*_gen.py\n", "ignored/a.py": BUGGY, "b_gen.py": BUGGY,
                 "kept.py": CLEAN})
    (root / ".git").mkdir()
    assert run_bnfix("check", ".", cwd=root).returncode == 0
    assert run_bnfix("check", "--no-respect-gitignore", ".", cwd=root).returncode == 1


def test_gitignore_negations_reinclude_folders_and_files_as_git_does(tree):
    """audioset_tagging_cnn's .gitignore ignores everything, then keeps every folder (`!*/`)
    and every file with a dot (`!*.*`): git tracks its .py files, so bnfix checks them (it had
    found no file at all); what a later pattern ignores again stays ignored."""
    root = tree({".gitignore": "*\n!*/\n!*.*\n_logs\n", "pytorch/main.py": BUGGY,
                 "_logs/run.py": BUGGY, "kept.py": CLEAN})
    (root / ".git").mkdir()
    listed = run_bnfix("check", "--show-files", ".", cwd=root).stdout.split()
    assert sorted(os.path.relpath(p, root) for p in listed) == ["kept.py", "pytorch/main.py"]
    assert run_bnfix("check", ".", cwd=root).returncode == 1


def test_bad_files_are_reported_and_the_run_goes_on(tree):
    root = tree({
        "py2.py": "import tensorflow as tf\nprint 'x', tf.layers.batch_normalization(x)\n",
        "latin.py": "# bn: batch_norm\nname = 'caf\xe9'\n".encode("latin-1"),
        "cookie.py": "# -*- coding: latin-1 -*-\n# batch_norm\nname = 'caf\xe9'\n".encode("latin-1"),
        "good.py": BUGGY,
    })
    (root / "broken.py").symlink_to(root / "missing.py")
    run = run_bnfix("check", "--output-format", "concise", ".", cwd=root)
    assert run.returncode == 1
    out = run.stdout
    assert "py2.py:2:" in out and "BN900 Python 2 source" in out
    assert "latin.py:2:1: BN901 not valid utf-8" in out
    assert "broken.py:1:1: BN901 cannot read" in out
    assert "cookie.py" not in out
    assert "good.py:4:64: BN001" in out


def test_lint_path_imports_no_framework_and_runs_no_user_code(tree):
    root = tree({
        "user_model.py": """
            import pathlib
            pathlib.Path(__file__).with_name("EXECUTED").write_text("user code ran")
            import tensorflow as tf
            import torch
            net = tf.layers.batch_normalization(x, training=True, trainable=False)
        """,
    })
    probe = (
        "import sys, bnfix.cli\n"
        "code = bnfix.cli.main(['check', '--fix', '--unsafe-fixes', '.'])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'tensorflow', 'torch', 'keras', 'tf_keras', 'onnx', 'onnxruntime', 'jax', 'user_model'})\n"
        "print('HEAVY', heavy, 'CODE', code)\n"
    )
    import subprocess
    proc = subprocess.run([sys.executable, "-c", probe], cwd=root, capture_output=True, text=True,
                          check=False)
    assert "HEAVY [] CODE 0" in proc.stdout, proc.stdout + proc.stderr
    assert not (root / "EXECUTED").exists()
    assert "trainable=True" in (root / "user_model.py").read_text()


# the analysis; and the standard modules that the records a run builds (a dataclass brings
# `dataclasses` and `inspect`) and argparse's help formatter (`shutil`, which imports the
# compression modules) would import: together a third of bnfix's own start-up (a run that
# writes its cache imports `tempfile`, and so `shutil`)
ANALYSIS_MODULES = ("bnfix.ir", "bnfix.project.index", "bnfix.project.summary",
                    "bnfix.project.view", "bnfix.source.lift", "libcst")
# the parser and the tokenizer too (only a file that is read is parsed), and no .gitignore
# library (bnfix/gitignore.py: pathspec took 30-40 ms to import)
START_UP_MODULES = (*ANALYSIS_MODULES, "dataclasses", "inspect", "shutil", "ast", "tokenize",
                    "pathspec")


def _loaded_after(argv: list[str], cwd, modules: tuple[str, ...] = START_UP_MODULES
                  ) -> tuple[str, list[str]]:
    """What `bnfix.cli.main(argv)` printed, and which of `modules` it imported (not those the
    interpreter had loaded before: a site `.pth` file may import `shutil` at start-up)."""
    probe = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import bnfix.cli\n"
        f"code = bnfix.cli.main({argv!r})\n"
        f"print('LOADED', [m for m in {modules!r} if m in sys.modules and m not in before],"
        " 'CODE', code)\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], cwd=cwd, capture_output=True, text=True,
                          check=False)
    return proc.stdout, proc.stderr


def test_a_warm_run_and_an_empty_one_import_no_analysis(tree):
    """Start-up: a run whose every file is unchanged since the last one reads the cache and
    reports; it never imports the IR, the summariser or the project index."""
    root = tree({"pkg/model.py": BUGGY, "train.py": "from pkg.model import bn\ny = bn(x, True)\n",
                 ".gitignore": "build/\n*.tmp.py\n"})
    old = 1_600_000_000  # older than the cache's racy window: the cache trusts size and mtime
    for path in (root / "pkg/model.py", root / "train.py"):
        os.utime(path, (old, old))
    cold = run_bnfix("check", "--output-format", "concise", ".", cwd=root)
    assert cold.returncode == 1 and "BN001" in cold.stdout, cold.stdout + cold.stderr
    out, err = _loaded_after(["check", "--output-format", "concise", "."], root)
    assert "LOADED [] CODE 1" in out, out + err
    assert cold.stdout in out  # the same report

    empty = root / "empty"
    empty.mkdir()
    out, err = _loaded_after(["check", "."], empty, ANALYSIS_MODULES)  # makes its cache folder
    assert "LOADED [] CODE 0" in out, out + err
    out, err = _loaded_after(["check", "."], empty)
    assert "LOADED [] CODE 0" in out, out + err
    # the control: a changed file is analysed, so the probe can see the modules load
    (root / "train.py").write_text("from pkg.model import bn\ny = bn(x, False)\n")
    out, err = _loaded_after(["check", "--output-format", "concise", "."], root)
    assert "'bnfix.project.index'" in out and "'bnfix.source.lift'" in out, out + err


def test_the_parser_is_built_for_the_command_given():
    from bnfix.cli import COMMANDS, build_parser

    assert set(build_parser("check").commands) == {"check"}
    assert set(build_parser("rule").commands) == {"rule"}
    assert set(build_parser(None).commands) == set(COMMANDS)  # `bnfix --help` lists them all
    assert set(build_parser("chek").commands) == set(COMMANDS)  # so "did you mean" can name one
    help_text = run_bnfix("--help").stdout
    assert all(name in help_text for name in COMMANDS)
    assert "usage: bnfix rule" in run_bnfix("rule", "--help").stdout


def test_parallel_jobs_give_the_same_results(tree):
    files = {f"pkg/m{i:03d}.py": BUGGY if i % 3 == 0 else CLEAN for i in range(90)}
    root = tree(files)
    serial = run_bnfix("check", "-j", "1", "--output-format", "json", ".", cwd=root)
    parallel = run_bnfix("check", "-j", "2", "--output-format", "json", ".", cwd=root)
    assert serial.returncode == parallel.returncode == 1
    assert json.loads(serial.stdout) == json.loads(parallel.stdout)
    assert len(json.loads(serial.stdout)) == 60


def test_no_progress_line_when_not_a_terminal(tree):
    root = tree({f"m{i}.py": CLEAN for i in range(5)})
    run = run_bnfix("check", ".", cwd=root)
    assert run.stderr == ""


def test_help_and_version():
    assert run_bnfix("--version").stdout.startswith("bnfix ")
    assert "check" in run_bnfix("--help").stdout
    assert run_bnfix().returncode == 2


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permissions")
def test_unreadable_file(tree):
    root = tree({"secret.py": BUGGY})
    (root / "secret.py").chmod(0)
    run = run_bnfix("check", "--output-format", "concise", ".", cwd=root)
    assert "BN901 cannot read: Permission denied" in run.stdout


def test_progress_line_on_a_terminal(tree):
    import io

    from bnfix.lint import LintOptions, run

    root = tree({f"m{i}.py": CLEAN for i in range(3)})
    out, err = io.StringIO(), io.StringIO()
    code = run(LintOptions(paths=[str(root)], progress=True, jobs=1), stdout=out, stderr=err)
    assert code == 0
    assert "\rbnfix: 1 files checked" in err.getvalue() and err.getvalue().endswith("\r\033[K")


def test_report_all_syntax_errors(tree):
    root = tree({"broken.py": "def f(:\n    pass\n", "fine.py": "x = 1\n"})
    assert run_bnfix("check", ".", cwd=root).returncode == 0  # nothing a rule reads
    run = run_bnfix("check", "--report-all-syntax-errors", "--output-format", "concise", ".",
                    cwd=root)
    assert run.returncode == 1 and run.stdout.startswith("broken.py:1:7: BN900 syntax error")
    (root / "pyproject.toml").write_text("[tool.bnfix]\nreport-all-syntax-errors = true\n")
    assert run_bnfix("check", ".", cwd=root).returncode == 1


BLOCK_FRAMEWORKS = """
import sys
from importlib.abc import MetaPathFinder

class Missing(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("numpy", "torch", "tensorflow", "keras", "onnx"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Missing())
from bnfix.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(("args", "extra"), [
    (["inspect", "model.pt"], "torch"),
    (["convert", "model.keras", "--to", "sync", "-o", "out.keras"], "tf"),
    (["validate", "torch", "m.py:f", "--input-shape", "2,3"], "torch"),
])
def test_commands_without_their_framework_say_which_extra_to_install(tree, args, extra):
    root = tree({"model.pt": b"\x80\x02}q\x00.", "model.keras": b"PK", "m.py": "def f(): pass\n"})
    proc = subprocess.run([sys.executable, "-c", BLOCK_FRAMEWORKS, *args], cwd=root,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and f'pip install "bnfix[{extra}]"' in proc.stderr
    assert not (root / "out.keras").exists()
