"""ruff parity of `bnfix check` / `bnfix fix`, run as a subprocess on real files: honest fix
safety (safe fixes apply by default, unsafe ones are counted and held back), ruff's flags and
their wording (checked against ruff 0.17.6), configuration files, and usage errors."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_bnfix

from bnfix import check_paths, check_source, load_rulebook
from bnfix.findings import Applicability

BOOK = load_rulebook()

BUGGY = '''
import tensorflow as tf

def bn(x, training, trainable=False):
    return tf.layers.batch_normalization(x, training=training, trainable=trainable)

net = bn(images, training=True)
ema = tf.train.ExponentialMovingAverage(0.99)
op = ema.apply(tf.global_variables())
'''
# BN007 on the default target (the experimental class is gone from TF 2.16): the named layer's
# rewrite is exact (safe), the unnamed one's changes its default name (unsafe).
SYNC = '''
import tensorflow as tf

stem = tf.keras.layers.experimental.SyncBatchNormalization(momentum=0.9, name="stem_bn")
head = tf.keras.layers.experimental.SyncBatchNormalization(momentum=0.9)

if __name__ == "__main__":
    print(stem, head)
'''
CLEAN = "import tensorflow as tf\n\nnet = tf.keras.layers.BatchNormalization()(images)\n"


def _findings(run) -> list[str]:
    return [line for line in run.stdout.splitlines() if ": BN" in line]


# -- fix safety ------------------------------------------------------------------------------


def _applicabilities(rule) -> set[Applicability]:
    """The applicabilities of the fixes a rule's fix examples get (single- and multi-file)."""
    found: set[Applicability] = set()
    for example in rule.examples:
        if example.kind != "fix":
            continue
        if example.files is None:
            diagnostics = check_source(example.source, "example.py", select=[rule.code])
        else:
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:
                for name, source in example.files.items():
                    (Path(tmp) / name).parent.mkdir(parents=True, exist_ok=True)
                    (Path(tmp) / name).write_text(source.lstrip("\n"), encoding="utf-8")
                diagnostics = check_paths([tmp], select=[rule.code]).remaining
        found |= {d.fix.applicability for d in diagnostics if d.code == rule.code and d.fixable}
    return found


@pytest.mark.parametrize("code", sorted(c for c, r in BOOK.rules.items()
                                        if r.target == "source" and r.fix != "none"))
def test_a_rules_fix_kind_is_what_its_fixes_are(code):
    """`fix = "unsafe"` offers no safe fix, `"mixed"` both kinds, `"safe"` only safe ones, and
    `"display-only"` nothing applicable: the rule table never claims more than the fixes do."""
    rule = BOOK.rules[code]
    found = _applicabilities(rule)
    expected = {"safe": {Applicability.SAFE}, "unsafe": {Applicability.UNSAFE},
                "mixed": {Applicability.SAFE, Applicability.UNSAFE}, "display-only": set()}
    assert found == expected[rule.fix], f"{code}: fix = {rule.fix!r} but its fixes are {found}"


def test_plain_fix_applies_the_exact_rewrite_and_holds_back_the_unsafe_one(tree):
    root = tree({"sync.py": SYNC})
    run = run_bnfix("fix", "--output-format", "concise", ".", cwd=root)
    text = (root / "sync.py").read_text()
    assert 'tf.keras.layers.BatchNormalization(momentum=0.9, name="stem_bn", synchronized=True)' \
        in text
    assert "head = tf.keras.layers.experimental.SyncBatchNormalization(momentum=0.9)" in text
    assert run.returncode == 1
    assert run.stdout.endswith("Found 2 errors (1 fixed, 1 remaining).\n"
                               "1 unsafe fix available with `--unsafe-fixes`.\n")


SYNC_EQUIVALENCE = """
import os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tempfile
import numpy as np
import tf_keras as K
old = K.layers.experimental.SyncBatchNormalization(momentum=0.9, name="bn")
new = K.layers.BatchNormalization(momentum=0.9, name="bn", synchronized=True)
assert old.get_config() == new.get_config(), (old.get_config(), new.get_config())
x = np.random.RandomState(0).randn(16, 5).astype("float32") * 3 + 1
for layer in (old, new):
    layer.build((None, 5))
assert np.array_equal(old(x, training=True), new(x, training=True))
assert np.array_equal(old.moving_mean.numpy(), new.moving_mean.numpy())
assert np.array_equal(old(x, training=False), new(x, training=False))
# unnamed: the default name changes, and by-name loading silently skips the layer
def model(layer):
    inp = K.Input((5,))
    return K.Model(inp, layer(K.layers.Dense(5)(inp)))
m_old = model(K.layers.experimental.SyncBatchNormalization())
m_new = model(K.layers.BatchNormalization(synchronized=True))
m_old.layers[-1].moving_mean.assign(np.arange(5, dtype="float32"))
path = os.path.join(tempfile.mkdtemp(), "w.h5")
m_old.save_weights(path)
m_new.load_weights(path)
assert m_new.layers[-1].moving_mean.numpy().tolist() == [0, 1, 2, 3, 4]  # by topology: fine
m_new.layers[-1].moving_mean.assign(np.zeros(5, dtype="float32"))
m_new.load_weights(path, by_name=True)
assert m_new.layers[-1].moving_mean.numpy().tolist() == [0] * 5, "by name: nothing restored"
assert m_old.layers[-1].name.startswith("sync_batch_normalization")
assert m_new.layers[-1].name.startswith("batch_normalization")
print("EXACT")
"""


@pytest.mark.skipif(importlib.util.find_spec("tf_keras") is None, reason="needs tf-keras")
def test_the_safe_sync_bn_rewrite_is_exact_and_the_unnamed_one_is_not():
    """The measurement behind BN007's Fix safety (tf_keras still has the experimental class)."""
    proc = subprocess.run([sys.executable, "-c", SYNC_EQUIVALENCE], capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.stdout.strip().endswith("EXACT"), proc.stderr[-3000:]


def test_unsafe_fixes_config_key_and_no_unsafe_fixes(tree):
    root = tree({"pyproject.toml": "[tool.bnfix]\nunsafe-fixes = true\n", "train.py": BUGGY})
    diff = run_bnfix("check", "--diff", ".", cwd=root)
    assert diff.returncode == 1 and "+def bn(x, training, trainable=True):" in diff.stdout
    assert diff.stdout.endswith("Would fix 2 errors.\n")
    held = run_bnfix("check", "--diff", "--no-unsafe-fixes", ".", cwd=root)
    assert held.returncode == 0
    assert held.stdout == "No errors would be fixed (2 fixes available with `--unsafe-fixes`).\n"
    listed = run_bnfix("check", "--output-format", "concise", ".", cwd=root)
    assert "BN001 [*] " in listed.stdout and "[*] 2 fixable with `--fix`." in listed.stdout
    fixed = run_bnfix("fix", ".", cwd=root)
    assert fixed.returncode == 0 and "Found 2 errors (2 fixed, 0 remaining)." in fixed.stdout
    assert "trainable=True" in (root / "train.py").read_text()


def test_fix_says_how_many_unsafe_fixes_it_held_back(tree):
    root = tree({"train.py": BUGGY})
    fix = run_bnfix("fix", "train.py", cwd=root)
    assert fix.returncode == 1 and (root / "train.py").read_text() == BUGGY.lstrip("\n")
    assert fix.stdout.endswith("Found 2 errors.\n2 unsafe fixes available with `--unsafe-fixes`.\n")
    check = run_bnfix("check", "train.py", cwd=root)
    assert check.stdout.endswith("2 unsafe fixes available with `--fix --unsafe-fixes`.\n")
    off = run_bnfix("check", "--no-unsafe-fixes", "train.py", cwd=root)
    assert off.stdout.endswith("\nFound 2 errors.\n"), "turned off on purpose: no hint (ruff)"
    nothing = run_bnfix("check", "--diff", "--select", "BN004", "--ignore", "BN004", "train.py",
                        cwd=root)
    assert nothing.returncode == 0 and nothing.stdout == "", "nothing to say: ruff says nothing"


def test_fix_only_and_show_fixes(tree):
    root = tree({"train.py": BUGGY})
    held = run_bnfix("fix", "--fix-only", "train.py", cwd=root)
    assert held.returncode == 0
    assert held.stdout == "No errors fixed (2 fixes available with `--unsafe-fixes`).\n"
    done = run_bnfix("fix", "--fix-only", "--show-fixes", "--unsafe-fixes", "train.py", cwd=root)
    assert done.returncode == 0
    assert done.stdout == ("\nFixed 2 errors:\n- train.py:\n"
                           "    1 × BN001 (frozen-affine-in-training)\n"
                           "    1 × BN004 (double-ema-of-bn-stats)\n\nFixed 2 errors.\n")
    assert run_bnfix("check", "--diff", "--show-fixes", ".", cwd=root).returncode == 2


def test_no_fix_overrides_fix_the_last_one_wins(tree):
    root = tree({"train.py": BUGGY})
    kept = run_bnfix("check", "--fix", "--no-fix", "--unsafe-fixes", "train.py", cwd=root)
    assert kept.returncode == 1 and "trainable=False" in (root / "train.py").read_text()
    fixed = run_bnfix("check", "--no-fix", "--fix", "--unsafe-fixes", "train.py", cwd=root)
    assert fixed.returncode == 0 and "trainable=True" in (root / "train.py").read_text()


# -- output ----------------------------------------------------------------------------------


def test_quiet_and_silent(tree):
    root = tree({"train.py": BUGGY, "empty/notes.txt": "x"})
    quiet = run_bnfix("check", "-q", "--output-format", "concise", ".", cwd=root)
    assert quiet.returncode == 1 and len(quiet.stdout.splitlines()) == 2
    assert all(": BN" in line for line in quiet.stdout.splitlines())
    assert run_bnfix("check", "--quiet", "empty", cwd=root).stderr == "", "no warning either"
    silent = run_bnfix("check", "-s", ".", cwd=root)
    assert (silent.returncode, silent.stdout, silent.stderr) == (1, "", "")


def test_output_file(tree):
    root = tree({"train.py": BUGGY})
    run = run_bnfix("check", "-o", "report.json", "--output-format", "json", ".", cwd=root)
    assert run.returncode == 1 and run.stdout == ""
    records = json.loads((root / "report.json").read_text())
    assert [r["code"] for r in records] == ["BN001", "BN004"]
    text = run_bnfix("check", "--output-file", "report.txt", "--output-format", "concise", ".",
                     cwd=root)
    assert text.stdout == ""
    assert (root / "report.txt").read_text().endswith("Found 2 errors.\n2 unsafe fixes "
                                                      "available with `--fix --unsafe-fixes`.\n")


def test_json_records_have_severity(tree):
    root = tree({"train.py": BUGGY, "sync.py": SYNC})
    records = json.loads(run_bnfix("check", "--output-format", "json", ".", cwd=root).stdout)
    assert {r["code"]: r["severity"] for r in records} == {
        code: BOOK.rules[code].severity for code in ("BN001", "BN004", "BN007")}
    assert BOOK.rules["BN007"].severity == "warning" and BOOK.rules["BN001"].severity == "error"


def test_statistics_honour_json(tree):
    root = tree({"a.py": BUGGY, "b.py": BUGGY, "sync.py": SYNC})
    records = json.loads(run_bnfix("check", "--statistics", "--output-format", "json", ".",
                                   cwd=root).stdout)
    assert records == [
        {"code": "BN001", "name": "frozen-affine-in-training", "count": 2, "fixable": False,
         "fixable_count": 0},
        {"code": "BN004", "name": "double-ema-of-bn-stats", "count": 2, "fixable": False,
         "fixable_count": 0},
        {"code": "BN007", "name": "deprecated-bn-api", "count": 2, "fixable": True,
         "fixable_count": 1},
    ]
    table = run_bnfix("check", "--statistics", ".", cwd=root).stdout
    assert "2\tBN007\t[*] deprecated-bn-api" in table and "2\tBN001\t[ ] frozen" in table
    bad = run_bnfix("check", "--statistics", "--output-format", "sarif", ".", cwd=root)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_add_noqa_is_idempotent_and_keeps_existing_codes(tree):
    source = BUGGY.replace("op = ema.apply(tf.global_variables())",
                           "op = ema.apply(tf.global_variables())  # noqa: E501")
    root = tree({"train.py": source})
    first = run_bnfix("check", "--add-noqa", ".", cwd=root)
    assert first.returncode == 0 and first.stderr == "Added 2 noqa directives.\n"
    text = (root / "train.py").read_text()
    assert "trainable=trainable)  # noqa: BN001\n" in text
    assert "op = ema.apply(tf.global_variables())  # noqa: BN004, E501\n" in text
    second = run_bnfix("check", "--add-noqa", ".", cwd=root)
    assert second.returncode == 0 and second.stderr == ""
    assert (root / "train.py").read_text() == text
    assert run_bnfix("check", ".", cwd=root).returncode == 0
    assert run_bnfix("check", "--add-noqa", "--diff", ".", cwd=root).returncode == 2


# -- settings and files ----------------------------------------------------------------------


def test_show_settings_and_show_files(tree):
    root = tree({"bnfix.toml": 'ignore = ["BN004"]\nunsafe-fixes = true\nextend-exclude = ["gen"]\n',
                 "train.py": BUGGY, "gen/made.py": BUGGY, "pkg/m.py": CLEAN,
                 "requirements.txt": "tensorflow==2.15.0\n"})
    shown = run_bnfix("check", "--show-settings", ".", cwd=root)
    assert shown.returncode == 0
    assert f'Settings path: "{(root / "bnfix.toml").resolve()}"' in shown.stdout
    assert 'ignore = ["BN004"]' in shown.stdout and "unsafe-fixes = true" in shown.stdout
    assert 'target-tensorflow = "2.15.0"  # the version the project\'s requirements pin' \
        in shown.stdout
    assert "\tfrozen-affine-in-training (BN001),\n" in shown.stdout
    assert "(BN004)" not in shown.stdout
    files = run_bnfix("check", "--show-files", ".", cwd=root)
    assert files.returncode == 0
    assert files.stdout.splitlines() == [str((root / "pkg/m.py").resolve()),
                                         str((root / "train.py").resolve())]


def test_config_files_precedence_and_isolated(tree):
    root = tree({"pyproject.toml": '[tool.bnfix]\nignore = ["BN001"]\n', "train.py": BUGGY})

    def codes(*args: str, cwd: Path = root) -> list[str]:
        run = run_bnfix("check", "--output-format", "concise", *args, ".", cwd=cwd)
        return [line.split()[1] for line in _findings(run)]

    assert codes() == ["BN004"]
    (root / "bnfix.toml").write_text('ignore = ["BN004"]\n')
    assert codes() == ["BN001"], "bnfix.toml wins over pyproject.toml"
    (root / ".bnfix.toml").write_text("ignore = []\n")
    assert codes() == ["BN001", "BN004"], ".bnfix.toml wins over bnfix.toml"
    assert codes("--config", "bnfix.toml") == ["BN001"]
    assert codes("--config", "pyproject.toml") == ["BN004"]
    (root / "sub").mkdir()
    (root / "sub" / "bnfix.toml").write_text('ignore = ["BN0"]\n')
    (root / "sub" / "t.py").write_text(BUGGY)
    assert codes(cwd=root / "sub") == [], "the nearest configuration wins"
    assert codes("--isolated", cwd=root / "sub") == ["BN001", "BN004"]
    both = run_bnfix("check", "--isolated", "--config", "bnfix.toml", ".", cwd=root)
    assert both.returncode == 2 and "--isolated cannot be used with --config" in both.stderr


def test_cache_dir(tree, tmp_path):
    root = tree({"train.py": BUGGY})
    elsewhere = tmp_path / "elsewhere-cache"
    assert run_bnfix("check", "--cache-dir", str(elsewhere), ".", cwd=root).returncode == 1
    assert list(elsewhere.glob("*.jsonl")) and (elsewhere / ".gitignore").is_file()
    assert not (root / ".bnfix_cache").exists()
    (root / "pyproject.toml").write_text('[tool.bnfix]\ncache-dir = "build/bnfix"\n')
    run_bnfix("check", ".", cwd=root)
    assert list((root / "build" / "bnfix").glob("*.jsonl"))
    env = tmp_path / "env-cache"
    run_bnfix("check", ".", cwd=root, env={"BNFIX_CACHE_DIR": str(env)})
    assert list(env.glob("*.jsonl")), "BNFIX_CACHE_DIR wins over the configuration"


def test_target_version_overrides_pins_and_configuration(tree):
    root = tree({"sync.py": SYNC, "requirements.txt": "tensorflow==2.15.0\n"})
    assert run_bnfix("check", ".", cwd=root).returncode == 0, "2.15 still has the class"
    later = run_bnfix("check", "--target-version", "2.16", "--output-format", "concise", ".",
                      cwd=root)
    assert later.returncode == 1 and "does not exist in TensorFlow 2.16" in later.stdout
    (root / "pyproject.toml").write_text('[tool.bnfix]\ntarget-tensorflow = "2.21"\n')
    assert run_bnfix("check", ".", cwd=root).returncode == 1
    assert run_bnfix("check", "--target-version", "tf2.15", ".", cwd=root).returncode == 0
    bad = run_bnfix("check", "--target-version", "latest", ".", cwd=root)
    assert bad.returncode == 2 and "`latest` is not a TensorFlow version like 2.15" in bad.stderr


def test_exclude_and_extend_exclude_on_the_command_line(tree):
    root = tree({"pyproject.toml": '[tool.bnfix]\nexclude = ["legacy"]\n',
                 "legacy/old.py": BUGGY, "gen/made.py": BUGGY, "src/train.py": CLEAN})

    def files(*args: str) -> list[str]:
        run = run_bnfix("check", "--output-format", "concise", *args, ".", cwd=root)
        return sorted({line.split(":")[0] for line in _findings(run)})

    assert files() == ["gen/made.py"]
    assert files("--extend-exclude", "gen") == []
    assert files("--exclude", "gen") == ["legacy/old.py"], "--exclude replaces the configuration's"


# -- paths -----------------------------------------------------------------------------------


def test_a_missing_path_is_a_finding_and_the_run_goes_on(tree):
    root = tree({"train.py": BUGGY})
    run = run_bnfix("check", "--output-format", "concise", "nope.py", "train.py", cwd=root)
    assert run.returncode == 1
    assert _findings(run)[0] == "nope.py:1:1: BN901 cannot read: No such file or directory"
    assert [line.split()[1] for line in _findings(run)] == ["BN901", "BN001", "BN004"]
    off = run_bnfix("check", "--select", "BN004", "nope.py", "train.py", cwd=root)
    assert off.returncode == 1 and "Found 1 error." in off.stdout
    assert off.stderr == "bnfix: warning: Failed to lint nope.py: No such file or directory\n"


def test_no_python_files_found_warning(tree):
    root = tree({"docs/readme.txt": "batch_norm"})
    run = run_bnfix("check", "docs", cwd=root)
    assert run.returncode == 0 and run.stdout == "All checks passed!\n"
    assert run.stderr == "bnfix: warning: No Python files found under the given path(s)\n"


# -- the command line ------------------------------------------------------------------------


def test_bad_flags_get_the_commands_usage_and_a_hint():
    flag = run_bnfix("check", "--selct", "BN001")
    assert flag.returncode == 2
    assert flag.stderr.startswith("usage: bnfix check [OPTIONS] [PATHS ...]\n")
    assert "unrecognized arguments: --selct (did you mean `--select`?)" in flag.stderr
    choice = run_bnfix("fix", "--output-format", "jsn")
    assert choice.returncode == 2 and "(did you mean `json`?)" in choice.stderr
    assert choice.stderr.startswith("usage: bnfix fix ")
    command = run_bnfix("chekc")
    assert command.returncode == 2 and "(did you mean `check`?)" in command.stderr
    top = run_bnfix("check", "--version")
    assert top.returncode == 2 and "`--version` is an option of `bnfix` itself" in top.stderr


def test_version_subcommand():
    from bnfix import __version__

    assert run_bnfix("version").stdout == f"bnfix {__version__}\n"
    assert run_bnfix("--version").stdout == f"bnfix {__version__}\n"
    assert json.loads(run_bnfix("version", "--output-format", "json").stdout) == {
        "version": __version__}


@pytest.mark.parametrize(("args", "command"), [
    (["check", "--select", "BN201"], "bnfix inspect"),
    (["check", "--select", "BN301"], "bnfix doctor"),
    (["fix", "--extend-select", "BN2"], "bnfix inspect"),
])
def test_selecting_another_commands_rules_is_a_usage_error(tree, args, command):
    root = tree({"train.py": BUGGY})
    run = run_bnfix(*args, ".", cwd=root)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and f"which `{command}` runs" in run.stderr


def test_a_selector_with_source_rules_among_others_is_fine(tree):
    root = tree({"broken.py": "def f(:\n"})
    run = run_bnfix("check", "--select", "BN9", "--report-all-syntax-errors", ".", cwd=root)
    assert run.returncode == 1 and "BN900" in run.stdout


def test_the_pre_commit_fix_hook_documents_the_configuration_key():
    hooks = (Path(__file__).resolve().parents[1] / ".pre-commit-hooks.yaml").read_text()
    header, *entries = hooks.split("\n- id: ")
    fix_hook = next(e for e in entries if e.startswith("bnfix-fix\n"))
    assert "unsafe-fixes = true" in fix_hook and "--unsafe-fixes" in fix_hook
    assert "`unsafe-fixes = true` in [tool.bnfix]" in header and "args: [--unsafe-fixes]" in header
