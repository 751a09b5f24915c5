"""Robustness: whole real trees, a hostile tree, random programs (hypothesis) and interruption.
Nothing crashes, every bad file is one clear line, and no file is ever half-written."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_bnfix

from bnfix import check_source, fix_source
from bnfix.source.text import SourceText
from bnfix.source.writer import apply_fixes

LINE = re.compile(r"^.+:\d+:\d+: BN\d{3} ")
SUMMARY = re.compile(r"^(Found \d+ errors?.*|All checks passed!|\[\*\] .*|"
                     r"\d+ unsafe fix(es)? available with .*)$")


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*.py") if p.is_file() and not p.is_symlink()}


def _parses(path: Path) -> bool:
    try:
        ast.parse(path.read_bytes())
    except (SyntaxError, ValueError):
        return False
    return True


# -- whole real trees ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("package", ["tensorflow", "keras", "torch"])
def test_whole_installed_tree_checks_and_fixes_cleanly(package: str, tmp_path: Path):
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package} is not installed")
    source = Path(next(iter(spec.submodule_search_locations)))
    copy = tmp_path / package
    shutil.copytree(source, copy, symlinks=True,
                    ignore=lambda d, names: [n for n in names if not n.endswith(".py")
                                             and not (Path(d) / n).is_dir()])
    check = run_bnfix("check", "--no-cache", "--report-all-syntax-errors", "--output-format",
                      "concise", str(copy), timeout=900)
    assert check.returncode in (0, 1), check.stderr[-2000:]
    assert "Traceback" not in check.stderr
    for line in check.stdout.splitlines():
        assert LINE.match(line) or SUMMARY.match(line) or not line.strip(), line
    flagged = {line.split(":", 1)[0] for line in check.stdout.splitlines() if LINE.match(line)}
    unparsable = {line.split(":", 1)[0] for line in check.stdout.splitlines()
                  if re.search(r": BN90[01] ", line)}
    really = {str(p) for p in copy.rglob("*.py") if p.is_file() and not _parses(p)}
    assert unparsable == really, "every unparsable file is one BN900/BN901 line, and only those"
    before = _hashes(copy)
    fix = run_bnfix("fix", "--unsafe-fixes", "--no-cache", str(copy), timeout=900)
    assert "Traceback" not in fix.stderr
    after = _hashes(copy)
    changed = {name for name in before if before[name] != after.get(name)}
    assert {str(copy / name) for name in changed} <= flagged, "only files with findings change"
    for name in changed:
        assert _parses(copy / name), f"{name} no longer parses"
    again = run_bnfix("fix", "--unsafe-fixes", "--no-cache", str(copy), timeout=900)
    assert _hashes(copy) == after, "a second fix changes nothing"
    assert "Traceback" not in again.stderr
    assert all(str(copy / name) not in unparsable for name in changed)


# -- a hostile tree -----------------------------------------------------------------------

BUG = "import torch.nn as nn\nbn = nn.BatchNorm2d(8, momentum=0.9)\n"


def _hostile(root: Path) -> dict[str, str]:
    """Write the tree; return file -> what bnfix must say about it."""
    files: dict[str, bytes] = {
        "py2.py": b"import torch.nn as nn\nprint 'bn', nn.BatchNorm2d(3)\n",
        "bad_utf8.py": b"import torch.nn as nn  # BatchNorm\nname = '\xff\xfe'\n",
        "bom.py": b"\xef\xbb\xbf" + BUG.encode(),
        "crlf.py": BUG.replace("\n", "\r\n").encode(),
        "mixed.py": b"import torch.nn as nn\r\n\nbn = nn.BatchNorm2d(8, momentum=0.9)\r\n",
        "tabs.py": b"import torch.nn as nn\nif True:\n\tbn = nn.BatchNorm2d(8, momentum=0.9)\n",
        "formfeed.py": b"import torch.nn as nn\n\x0c\nbn = nn.BatchNorm2d(8, momentum=0.9)\n",
        "deep_parens.py": b"import torch.nn as nn\nx = " + b"(" * 1000 + b"nn.BatchNorm2d(3)"
        + b")" * 1000 + b"\n",
        "x.py/inside.py": BUG.encode(),
        "README.md": b"BatchNorm2d momentum=0.9\n",
        "data.bin": bytes(range(256)) * 16,
        "script": b"#!/usr/bin/env python\nimport torch.nn as nn\nnn.BatchNorm2d(8, momentum=0.9)\n",
    }
    nested = "import torch.nn as nn\n" + "".join(
        "    " * i + "if x:\n" for i in range(90)) + "    " * 90 + "bn = nn.BatchNorm2d(8, momentum=0.9)\n"
    files["deep_blocks.py"] = nested.encode()
    padding = "".join(f"value_{i:07d} = [1, 2, 3]  # {'padding ' * 8}\n" for i in range(110_000))
    files["big.py"] = (padding + BUG).encode()
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / "loop_a.py").symlink_to(root / "loop_b.py")
    (root / "loop_b.py").symlink_to(root / "loop_a.py")
    (root / "broken.py").symlink_to(root / "missing.py")
    (root / "sub").mkdir()
    (root / "sub" / "again").symlink_to(root)  # a directory loop
    (root / "sub" / "ok.py").write_bytes(BUG.encode())
    return {
        "py2.py": "BN900 Python 2 source", "bad_utf8.py": "BN901 not valid utf-8",
        "deep_parens.py": "BN900 syntax error", "loop_a.py": "BN901 cannot read",
        "loop_b.py": "BN901 cannot read", "broken.py": "BN901 cannot read",
        "bom.py": "BN008", "crlf.py": "BN008", "mixed.py": "BN008", "tabs.py": "BN008",
        "formfeed.py": "BN008", "deep_blocks.py": "BN008", "big.py": "BN008",
        "x.py/inside.py": "BN008", "sub/ok.py": "BN008",
    }


@pytest.mark.slow
def test_hostile_tree(tmp_path: Path):
    root = tmp_path / "tree"
    root.mkdir()
    expected = _hostile(root)
    # big.py is 9.9 MiB: above the default max-file-size (2 MiB), so the cap is raised here
    run = run_bnfix("check", "--no-cache", "--max-file-size", "16M", "--output-format", "concise",
                    ".", cwd=root, timeout=600)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr[-2000:]
    by_file: dict[str, list[str]] = {}
    for line in run.stdout.splitlines():
        if LINE.match(line):
            name, _, _, rest = line.split(":", 3)
            by_file.setdefault(name, []).append(rest.strip())
    assert set(by_file) == set(expected), by_file
    for name, what in expected.items():
        assert len(by_file[name]) == 1 and by_file[name][0].startswith(what), (name, by_file[name])
    fix = run_bnfix("fix", "--unsafe-fixes", "--no-cache", "--max-file-size", "16M", ".", cwd=root,
                    timeout=600)
    assert "Traceback" not in fix.stderr
    assert (root / "bom.py").read_bytes().startswith(b"\xef\xbb\xbf")
    assert b"momentum=1 - 0.9)\r\n" in (root / "crlf.py").read_bytes()
    assert b"\tbn = nn.BatchNorm2d(8, momentum=1 - 0.9)\n" in (root / "tabs.py").read_bytes()
    for name in ("bom.py", "crlf.py", "mixed.py", "tabs.py", "formfeed.py", "big.py",
                 "deep_blocks.py", "x.py/inside.py"):
        assert _parses(root / name) and b"1 - 0.9" in (root / name).read_bytes(), name
    assert (root / "py2.py").read_bytes().startswith(b"import torch.nn as nn\nprint 'bn'")


# -- interruption -------------------------------------------------------------------------


def _many_files(root: Path, count: int) -> tuple[bytes, bytes]:
    body = "import torch.nn as nn\n" + "".join(
        f"bn_{i} = nn.BatchNorm2d({i % 64 + 1}, momentum=0.9)\n" for i in range(300))
    fixed = fix_source(body, "m.py", unsafe_fixes=True).text
    for i in range(count):
        (root / f"m{i:04d}.py").write_text(body)
    return body.encode(), fixed.encode()


def _default_sigint() -> None:
    """Ctrl-C as in a terminal, also when the tests run as a background job of a shell script
    (which starts them with SIGINT ignored, so Python would install no handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_interrupted_fix_leaves_every_file_original_or_fully_fixed(tmp_path: Path, sig, code, jobs):
    original, fixed = _many_files(tmp_path, 240)
    proc = subprocess.Popen([sys.executable, "-m", "bnfix", "fix", "--unsafe-fixes", "--no-cache",
                             "-j", jobs, "--no-progress", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=_default_sigint)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until some files are written, not all
        done = sum(p.read_bytes() == fixed for p in tmp_path.glob("*.py"))
        if done >= 3:
            break
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    states = [p.read_bytes() for p in sorted(tmp_path.glob("*.py"))]
    assert all(s in (original, fixed) for s in states), "a file is half-written"
    assert any(s == fixed for s in states)
    if proc.returncode == code:  # it was still working when the signal came
        assert b"interrupted" in err
        assert any(s == original for s in states)
    else:
        assert proc.returncode == 0, err[-2000:]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".bnfix")], "temporary files left"


# -- random programs (hypothesis) -----------------------------------------------------------

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

IMPORTS = {
    "torch": ["import torch.nn as nn\n", "from torch import nn\n", "import torch\nnn = torch.nn\n"],
    "tf": ["import tensorflow as tf\n", "import tensorflow.compat.v1 as tf\n"],
    "keras": ["from tensorflow.keras import layers\n", "import keras\nlayers = keras.layers\n"],
}


@st.composite
def programs(draw) -> str:
    indent = draw(st.sampled_from(["    ", "  ", "\t"]))
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    lines = draw(st.sampled_from(IMPORTS["torch"])) + draw(st.sampled_from(IMPORTS["tf"])) + \
        draw(st.sampled_from(IMPORTS["keras"]))
    constant = draw(st.sampled_from([0.9, 0.99, 0.1, 0.01, 0.5]))
    lines += f"MOMENTUM = {constant}\n"
    body = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.integers(0, 6))
        m = draw(st.sampled_from(["0.9", "0.1", "MOMENTUM", "1 - 0.9", "0.997"]))
        if kind == 0:
            body.append(f"bn = nn.BatchNorm2d(8, momentum={m})")
        elif kind == 1:
            body.append(f"bn = nn.BatchNorm1d(8, 1e-5, {m})  # positional")
        elif kind == 2:
            body.append(f"x = layers.BatchNormalization(momentum={m},\n{indent}{indent}epsilon=1e-3)(x)")
        elif kind == 3:
            body.append("seq = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))")
        elif kind == 4:
            body.append("y = tf.layers.batch_normalization(x, training=True, trainable=False)")
        elif kind == 5:
            body.append("y = tf.contrib.layers.batch_norm(x, decay=0.9, is_training=True)")
        else:
            body.append(f"z = tf.keras.layers.experimental.SyncBatchNormalization(momentum={m})")
    wrap = draw(st.integers(0, 2))
    if wrap == 0:
        text = "\n".join(body)
    elif wrap == 1:
        text = "def build(x, training):\n" + "\n".join(
            indent + line.replace("\n", "\n" + indent) for line in body) + f"\n{indent}return x"
    else:
        text = "class Net(nn.Module):\n" + indent + "def __init__(self, x):\n" + "\n".join(
            indent * 2 + line.replace("\n", "\n" + indent * 2) for line in body)
    return (lines + text + "\n").replace("\n", newline)


@hypothesis.settings(max_examples=120, deadline=None, suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(programs())
def test_random_programs_fix_parses_is_idempotent_and_local(source: str):
    diagnostics = check_source(source, "m.py")
    fixable = [d for d in diagnostics if d.fixable]
    applied = apply_fixes(SourceText(source), [d.fix for d in fixable])
    rows: set[int] = set()
    for index in applied.applied:
        for edit in fixable[index].fix.edits:
            rows.update(range(edit.span.start.row, edit.span.end.row + 1))
    old_lines = SourceText(source)
    new_text = applied.text
    # every original row outside the edited rows is still in the result, in order
    untouched = [old_lines.line(r) for r in range(1, old_lines.row_count + 1) if r not in rows]
    remaining = iter(SourceText(new_text).line(r) for r in range(1, SourceText(new_text).row_count + 1))
    assert all(any(line == other for other in remaining) for line in untouched)
    result = fix_source(source, "m.py", unsafe_fixes=True)
    ast.parse(result.text)
    assert fix_source(result.text, "m.py", unsafe_fixes=True).text == result.text
    if "\r\n" in source:
        assert "\n" not in result.text.replace("\r\n", "")
