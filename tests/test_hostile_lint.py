"""Hostile inputs, races and interruptions on the lint path (`bnfix check` / `bnfix fix`, the
cache, the configuration, start-up): issue 14. Every input is generated here, small on disk;
each case asserts the exit code, that the failure is one line with no traceback, and that
nothing changed beyond what was asked. Hangs and blow-ups run in a subprocess under a timeout
and `resource.setrlimit`; races are made deterministic by a hook, never by timing."""

from __future__ import annotations

import hashlib
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import bnfix.fixes
import bnfix.project.session
from bnfix.cli import main
from bnfix.config import Settings
from bnfix.source.reader import DEFAULT_MAX_FILE_BYTES

TORCH_BUG = "import torch.nn as nn\nbn = nn.BatchNorm2d(8, momentum=0.9)\n"
TORCH_CLEAN = "import torch.nn as nn\nbn = nn.BatchNorm2d(8, momentum=0.1)\n"  # same size
FIXED = "import torch.nn as nn\nbn = nn.BatchNorm2d(8, momentum=1 - 0.9)\n"
# BN004 and BN008 in one file: two selections, two different fixes
TWO_RULES = textwrap.dedent("""\
    import tensorflow as tf
    import torch.nn as nn

    ema = tf.train.ExponentialMovingAverage(0.99)
    op = ema.apply(tf.global_variables())
    norm = nn.BatchNorm2d(8, momentum=0.9)
""")
SECRET = "https://admin:hunter2@db.example.com/prod"


def bnfix_here(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, list[str]]:
    """`bnfix ARGS` in this process: exit code, stdout, stderr lines."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err.splitlines()


def bnfix_process(*args: str, cwd: Path, memory: int = 2 << 30, timeout: float = 120,
                  cpu: int | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m bnfix ARGS` in a subprocess under an address-space (and CPU) limit."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        if cpu is not None:
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))

    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    env.pop("PRE_COMMIT", None)
    return subprocess.run([sys.executable, "-m", "bnfix", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env, check=False,
                          preexec_fn=limit)


def no_traceback(*streams: str | list[str]) -> bool:
    return not any("Traceback" in (s if isinstance(s, str) else "\n".join(s)) for s in streams)


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()
            and ".bnfix_cache" not in p.parts}


# -- 1. the size cap ----------------------------------------------------------------------


def test_max_file_size_skips_a_file_with_one_line_and_the_run_goes_on(tmp_path, capsys,
                                                                      monkeypatch):
    (tmp_path / "big.py").write_text(TORCH_BUG + "x = 1\n" * 600)  # 3659 bytes
    (tmp_path / "a.py").write_text(TORCH_BUG)
    monkeypatch.chdir(tmp_path)
    size = (tmp_path / "big.py").stat().st_size
    code, out, err = bnfix_here(capsys, "check", "--no-cache", "--output-format", "concise",
                                "--max-file-size", "1k", ".")
    assert code == 1 and out.startswith("a.py:2:24: BN008") and "big.py" not in out
    assert err == [f"bnfix: big.py: skipped: {size} bytes > max-file-size (1024 bytes); raise it "
                   "with --max-file-size or `max-file-size` in [tool.bnfix] to check it"]
    # the key in [tool.bnfix] does the same; the command line wins over it (0: no limit)
    (tmp_path / "pyproject.toml").write_text('[tool.bnfix]\nmax-file-size = "2k"\n')
    code, out, err = bnfix_here(capsys, "check", "--no-cache", "--output-format", "concise", ".")
    assert code == 1 and "big.py" not in out and err[0].endswith(
        "skipped: 3659 bytes > max-file-size (2048 bytes); raise it with --max-file-size or "
        "`max-file-size` in [tool.bnfix] to check it")
    code, out, err = bnfix_here(capsys, "check", "--no-cache", "--output-format", "concise",
                                "--max-file-size", "0", ".")
    assert code == 1 and "big.py:2:24: BN008" in out and err == []


def test_the_default_cap_skips_a_big_file_without_reading_it(tmp_path, capsys, monkeypatch):
    assert Settings(root=tmp_path).max_file_size == DEFAULT_MAX_FILE_BYTES == 2 * 1024 * 1024
    with open(tmp_path / "huge.py", "wb") as fh:  # sparse: 3 MiB long, nothing on disk
        fh.truncate(3 * 1024 * 1024)
    monkeypatch.chdir(tmp_path)
    code, out, err = bnfix_here(capsys, "fix", "--no-cache", "huge.py")
    assert code == 0 and err == [
        f"bnfix: huge.py: skipped: {3 * 1024 * 1024} bytes > max-file-size (2097152 bytes); "
        "raise it with --max-file-size or `max-file-size` in [tool.bnfix] to check it"]


@pytest.mark.parametrize(("value", "shown"), [('"2X"', '"2X"'), ("-1", "-1"), ("true", "true"),
                                              ('"1.5M"', '"1.5M"')])
def test_a_bad_max_file_size_is_one_line(tmp_path, capsys, monkeypatch, value, shown):
    (tmp_path / "pyproject.toml").write_text(f"[tool.bnfix]\nmax-file-size = {value}\n")
    (tmp_path / "a.py").write_text(TORCH_BUG)
    monkeypatch.chdir(tmp_path)
    code, out, err = bnfix_here(capsys, "check", ".")
    assert code == 2 and out == "" and len(err) == 1
    assert err[0].startswith(f"bnfix: {tmp_path / 'pyproject.toml'}: [tool.bnfix] "
                             "`max-file-size` must be a size in bytes")
    assert err[0].endswith(f"not {shown}")


def test_a_big_one_line_file_is_fixed_with_a_small_libcst_check(tmp_path, capsys, monkeypatch):
    """The 2 MB one-line list took 5.8 GB and a minute: the final LibCST check parsed the whole
    file. Only the statement a fix changed is given to LibCST now."""
    import libcst

    parsed: list[int] = []
    real = libcst.parse_module
    monkeypatch.setattr(libcst, "parse_module", lambda text, *a, **k: (
        parsed.append(len(text)), real(text, *a, **k))[1])
    (tmp_path / "big.py").write_text(TORCH_BUG + "x = [" + "0, " * 60_000 + "]\n")
    monkeypatch.chdir(tmp_path)
    code, out, _ = bnfix_here(capsys, "fix", "--unsafe-fixes", "--no-cache", "big.py")
    assert code == 0 and "1 fixed, 0 remaining" in out
    assert (tmp_path / "big.py").read_text().startswith(FIXED)
    assert parsed == [len("bn = nn.BatchNorm2d(8, momentum=1 - 0.9)\n")]


def test_thousands_of_findings_on_one_row_show_a_window_of_it(tmp_path, capsys, monkeypatch):
    """Every finding kept its whole row for display: 1 GB for 6,000 findings on a 200 KB row."""
    statement = "bn=nn.BatchNorm2d(8,momentum=0.9);"
    (tmp_path / "dense.py").write_text("import torch.nn as nn\n" + statement * 3000 + "\n")
    monkeypatch.chdir(tmp_path)
    code, out, _ = bnfix_here(capsys, "check", "--no-cache", "dense.py")
    assert code == 1 and "Found 3000 errors." in out
    rows = [line for line in out.splitlines() if line.startswith("2 | ")]
    assert len(rows) == 3000 and max(map(len, rows)) <= 4 + 200 + 2
    # a cut row is marked, and the caret still points at the finding's column
    first = out.split("\n\n")[1].splitlines()  # the second finding: column 55
    assert first[0].startswith("dense.py:2:55: BN008")
    text, caret = first[3], first[4]
    assert text.startswith("2 | …") and text.endswith("…")
    start = caret.index("^")
    assert text[start:start + 12] == "momentum=0.9"


def test_a_long_row_with_non_ascii_text_is_linear(tmp_path):
    """Each position on a row holding a non-ASCII character re-encoded the row: 300,000 calls
    on a 1.8 MB row ran for more than 5 minutes. Now a 600 KB row takes seconds of CPU."""
    (tmp_path / "wide.py").write_text(TORCH_BUG + 'x = ["é", ' + "f(0), " * 100_000 + "]\n")
    run = bnfix_process("check", "--no-cache", "--output-format", "concise", "wide.py",
                        cwd=tmp_path, cpu=60, memory=3 << 30)
    assert run.returncode == 1 and "wide.py:2:24: BN008" in run.stdout, run.stderr[-2000:]


def test_long_fluent_chains_are_linear(tmp_path):
    """Each call of a fluent chain `self.a().a()...` is recorded with the methods before it:
    20 chains of 900 calls (Python's parser allows about a thousand) took 18 s of CPU and
    330 MB before chains were cut at 64 links (124 s before each method's binding was kept);
    now a fraction of a second."""
    chain = "        x = self" + ".a()" * 900 + "\n"
    (tmp_path / "chains.py").write_text(
        TORCH_BUG + "\n\nclass Net(nn.Module):\n    def __init__(self):\n"
        "        self.bn = nn.BatchNorm2d(3)\n\n    def forward(self):\n" + chain * 20
        + "\n    def a(self):\n        return self\n")
    run = bnfix_process("check", "--no-cache", "--output-format", "concise", "chains.py",
                        cwd=tmp_path, cpu=10, memory=1 << 30)
    assert run.returncode == 1 and "chains.py:2:24: BN008" in run.stdout, run.stderr[-2000:]


# -- 2. special files -----------------------------------------------------------------------


def test_a_tree_nested_deeper_than_the_recursion_limit_is_walked(tmp_path):
    """1,500 nested folders (a 3,000-character path, under PATH_MAX): the walk keeps a stack,
    not Python's recursion (it exceeded the limit), and the file at the bottom is checked.
    Then a file whose folder's path is at the system's limit: nothing named beside it fits
    (the configuration files, the pin files looked for there), and that is no error."""
    root = tmp_path / "tree"
    root.mkdir()
    (root / "a.py").write_text(TORCH_BUG)
    limit = os.pathconf("/", "PC_PATH_MAX") - 1  # a path's characters, its NUL aside
    deep, edge = _nest(str(root), levels=1500), _nest(str(tmp_path / "edge"), length=limit)
    try:
        Path(deep, "m.py").write_text(TORCH_BUG)
        Path(edge, "m.py").write_text(TORCH_BUG)
        found = bnfix_process("check", "--output-format", "concise", ".", cwd=root, timeout=120)
        assert found.returncode == 1 and no_traceback(found.stderr), found.stderr[-2000:]
        lines = found.stdout.splitlines()
        assert lines[0].startswith("a.py:2:24: BN008")
        assert lines[1].startswith("d/" * 1500 + "m.py:2:24: BN008")
        assert lines[2] == "Found 2 errors."
        for named in (edge, edge + "/m.py"):
            near = bnfix_process("check", "--output-format", "concise", named, cwd=tmp_path,
                                 timeout=120)
            assert near.returncode == 1 and near.stderr == "", near.stderr[-2000:]
            assert ":2:24: BN008" in near.stdout
    finally:  # deepest first: pytest's own clean-up of tmp_path recurses
        for top, bottom in ((str(root), deep), (str(tmp_path / "edge"), edge)):
            for name in os.listdir(bottom):
                os.unlink(os.path.join(bottom, name))
            while len(bottom) > len(top):
                os.rmdir(bottom)
                bottom = os.path.dirname(bottom)


def _nest(top: str, levels: int = 0, length: int = 0) -> str:
    """Folders `d` inside `top`, one in the other: `levels` of them, or as many as leave room
    for `/m.py` under a path of `length` characters. One at a time: os.makedirs and
    Path.mkdir recurse themselves."""
    os.makedirs(top, exist_ok=True)
    folder = top
    while folder.count("/d") < levels if levels else len(folder) + 2 + len("/m.py") <= length:
        folder += "/d"
        os.mkdir(folder)
    return folder


def test_a_gitignore_too_large_to_read_is_named_and_not_applied(tmp_path):
    """A .gitignore over the 4 MB bnfix reads of one is not applied, and the run says so once
    (both walks meet it); one just under the limit, of 100,000 generated lines, is applied."""
    from bnfix.files import MAX_GITIGNORE_BYTES

    root = tmp_path / "tree"
    root.mkdir()
    (root / ".git").mkdir()
    (root / "a.py").write_text(TORCH_BUG)
    (root / "b.py").write_text(TORCH_BUG)
    generated = "".join(f"build/out_{i}/f_{i}.o\n" for i in range(100000))
    (root / ".gitignore").write_text("b.py\n" + generated)
    assert (root / ".gitignore").stat().st_size < MAX_GITIGNORE_BYTES
    applied = bnfix_process("check", "--output-format", "concise", ".", cwd=root, timeout=60)
    assert applied.stderr == "" and applied.stdout.startswith("a.py:2:24: BN008")
    assert "b.py" not in applied.stdout
    (root / ".gitignore").write_text("b.py\n" + "#" * MAX_GITIGNORE_BYTES + "\n")
    skipped = bnfix_process("check", "--output-format", "concise", ".", cwd=root, timeout=60)
    assert "b.py:2:24: BN008" in skipped.stdout and no_traceback(skipped.stderr)
    assert skipped.stderr == ("bnfix: .gitignore: not applied: larger than the 4 MB "
                              "bnfix reads of an ignore file (the files it ignores are checked; "
                              "exclude them with `extend-exclude`)\n")


def test_fifos_and_devices_never_block_or_eat_memory(tmp_path):
    root = tmp_path / "tree"
    root.mkdir()
    (root / "a.py").write_text(TORCH_BUG)
    os.mkfifo(root / "fifo.py")  # walked
    (root / "link.py").symlink_to(root / "fifo.py")  # a link to it, inside the tree
    (root / "zero.py").symlink_to("/dev/zero")  # a link out of the tree: not even opened
    os.mkfifo(root / ".gitignore")  # read during the walk
    first = bnfix_process("check", "--output-format", "concise", ".", cwd=root, memory=1 << 30,
                          timeout=60)
    assert first.returncode == 1 and no_traceback(first.stderr), first.stderr
    lines = first.stdout.splitlines()
    assert lines[0].startswith("a.py:2:24: BN008") and lines[1:4] == [
        "fifo.py:1:1: BN901 cannot read: a FIFO, not a regular file",
        "link.py:1:1: BN901 cannot read: a FIFO, not a regular file", "Found 3 errors."]
    assert first.stderr == (f"bnfix: zero.py: skipped: a symbolic link to a file outside {root} "
                            "(name it on the command line to check it)\n")
    # named on the command line: opened, refused without blocking; a FIFO where the cache file
    # and its temporary files go; a FIFO given as --config
    (cache,) = (root / ".bnfix_cache").glob("*.jsonl")
    cache.unlink()
    os.mkfifo(cache)
    os.mkfifo(root / ".bnfix_cache" / ".cache.left")
    os.utime(root / ".bnfix_cache" / ".cache.left", (1, 1))
    again = bnfix_process("check", "--output-format", "concise", "fifo.py", "zero.py", "a.py",
                          cwd=root, memory=1 << 30, timeout=60)
    assert again.returncode == 1 and again.stderr == ""
    assert again.stdout.splitlines()[:3] == [
        again.stdout.splitlines()[0], "fifo.py:1:1: BN901 cannot read: a FIFO, not a regular file",
        "zero.py:1:1: BN901 cannot read: a device, not a regular file"]
    assert again.stdout.startswith("a.py:2:24: BN008")
    os.mkfifo(root / "cfg.toml")
    config = bnfix_process("check", "--config", "cfg.toml", ".", cwd=root, timeout=60)
    assert config.returncode == 2 and config.stdout == ""
    assert config.stderr == "bnfix: cfg.toml: cannot read: a FIFO, not a regular file\n"
    fixed = bnfix_process("fix", "--unsafe-fixes", ".", cwd=root, memory=1 << 30, timeout=60)
    assert fixed.returncode == 1 and no_traceback(fixed.stderr)
    assert (root / "a.py").read_text() == FIXED


# -- 3. lost updates --------------------------------------------------------------------------


def _before_the_write(monkeypatch: pytest.MonkeyPatch, action) -> list[bool]:  # type: ignore[no-untyped-def]
    """Run `action` once, when bnfix re-reads the file just before replacing it."""
    done: list[bool] = []
    real = bnfix.fixes.current_digest

    def hooked(path: Path) -> str | None:
        if not done:
            done.append(True)
            action()
        return real(path)

    monkeypatch.setattr(bnfix.fixes, "current_digest", hooked)
    return done


@pytest.mark.parametrize("links", [1, 2])
def test_two_fix_runs_with_other_selections_lose_no_fix(tmp_path, capsys, monkeypatch, links):
    path = tmp_path / "train.py"
    path.write_text(TWO_RULES)
    if links == 2:  # rewritten in place: the same check before the write
        os.link(path, tmp_path / "other_name.py")

    def other_run() -> None:  # another `bnfix fix`, with another selection, finishes meanwhile
        run = bnfix_process("fix", "--unsafe-fixes", "--select", "BN004", "--no-cache",
                            "train.py", cwd=tmp_path)
        assert run.returncode == 0, run.stderr

    done = _before_the_write(monkeypatch, other_run)
    monkeypatch.chdir(tmp_path)
    code, out, err = bnfix_here(capsys, "fix", "--unsafe-fixes", "--select", "BN008",
                                "--no-cache", "--output-format", "concise", "train.py")
    assert done and code == 1
    assert err == ["bnfix: train.py: not fixed, 1 fix not applied: the file changed after bnfix "
                   "read it (saved by an editor, or by another bnfix run?); run bnfix fix again"]
    assert out.startswith("train.py:6:26: BN008 [*]") and "Found 1 error." in out
    assert path.read_text() == TWO_RULES.replace("tf.global_variables()", "tf.trainable_variables()")
    code, out, err = bnfix_here(capsys, "fix", "--unsafe-fixes", "--select", "BN008",
                                "--no-cache", "train.py")
    assert code == 0 and err == []
    assert path.read_text() == TWO_RULES.replace("tf.global_variables()", "tf.trainable_variables()"
                                                 ).replace("momentum=0.9", "momentum=1 - 0.9")
    assert os.stat(path).st_nlink == links
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".bnfix")] == []


@pytest.mark.parametrize("how", ["in place", "by rename"])
def test_an_editor_save_during_fix_is_kept(tmp_path, capsys, monkeypatch, how):
    path = tmp_path / "a.py"
    path.write_text(TORCH_BUG)
    edited = TORCH_BUG + "print('my edit')\n"

    def save() -> None:
        if how == "in place":
            path.write_text(edited)
        else:
            (tmp_path / "a.py.swp").write_text(edited)
            os.replace(tmp_path / "a.py.swp", path)

    _before_the_write(monkeypatch, save)
    monkeypatch.chdir(tmp_path)
    code, _, err = bnfix_here(capsys, "fix", "--unsafe-fixes", "--no-cache", "a.py")
    assert code == 1 and len(err) == 1 and "the file changed after bnfix read it" in err[0]
    assert path.read_text() == edited
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.py"]


# -- 4. the cache and an edit saved during `check` ----------------------------------------------


@pytest.mark.parametrize("same_time", [True, False], ids=["coarse-clock", "fine-clock"])
def test_an_edit_saved_during_check_is_seen_by_the_next_run(tmp_path, capsys, monkeypatch,
                                                           same_time):
    """The edit lands after bnfix read and analysed the file, before the cache is saved, with
    the same size — and, on a file system with a coarse clock, the same modification time —
    so the file's stat cannot tell the next run."""
    path = tmp_path / "a.py"
    path.write_text(TORCH_CLEAN)
    (tmp_path / "pyproject.toml").write_text("[tool.bnfix]\n")
    Worker = bnfix.project.session.Worker
    real = Worker.check
    edits: list[bool] = []

    def check_then_edit(self, file, *args, **kwargs):  # type: ignore[no-untyped-def]
        result = real(self, file, *args, **kwargs)
        if Path(file).name == "a.py" and not edits:
            edits.append(True)
            before = os.stat(path)
            path.write_text(TORCH_BUG)  # saved by the editor while bnfix finishes
            if same_time:
                os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        return result

    monkeypatch.setattr(Worker, "check", check_then_edit)
    monkeypatch.chdir(tmp_path)
    code, out, _ = bnfix_here(capsys, "check", "--output-format", "concise", ".")
    assert edits and code == 0, out  # what was read was clean
    monkeypatch.setattr(Worker, "check", real)
    code, out, _ = bnfix_here(capsys, "check", "--output-format", "concise", ".")
    assert code == 1 and out.startswith("a.py:2:24: BN008"), "a stale clean entry was served"


# -- 5. read-only files, owners and hard links ---------------------------------------------------


def test_a_read_only_file_is_reported_not_replaced(tmp_path, capsys, monkeypatch):
    path = tmp_path / "a.py"
    path.write_text(TORCH_BUG)
    path.chmod(0o444)
    inode = path.stat().st_ino
    monkeypatch.chdir(tmp_path)
    code, out, err = bnfix_here(capsys, "fix", "--unsafe-fixes", "--no-cache", "a.py")
    assert code == 1 and "a.py:2:24: BN008" in out
    assert err == ["bnfix: a.py: not fixed, 1 fix not applied: it is read-only (mode 0444); make "
                   "it writable to fix it"]
    assert path.read_text() == TORCH_BUG and path.stat().st_ino == inode
    assert (path.stat().st_mode & 0o777) == 0o444


def test_hard_links_and_mode_are_kept(tmp_path, capsys, monkeypatch):
    path = tmp_path / "a.py"
    path.write_text(TORCH_BUG)
    path.chmod(0o640)
    os.link(path, tmp_path / "b.py")
    inode = path.stat().st_ino
    monkeypatch.chdir(tmp_path)
    code, _, err = bnfix_here(capsys, "fix", "--unsafe-fixes", "--no-cache", "a.py")
    assert code == 0 and err == []
    assert (tmp_path / "b.py").read_text() == FIXED and path.stat().st_ino == inode
    assert path.stat().st_nlink == 2 and (path.stat().st_mode & 0o777) == 0o640


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="giving a file another owner needs root")
def test_owner_and_group_are_kept_when_root_fixes(tmp_path, capsys, monkeypatch):
    path = tmp_path / "a.py"
    path.write_text(TORCH_BUG)
    os.chown(path, 4321, 8765)
    monkeypatch.chdir(tmp_path)
    code, _, err = bnfix_here(capsys, "fix", "--unsafe-fixes", "--no-cache", "a.py")
    assert code == 0 and err == [] and path.read_text() == FIXED
    assert (path.stat().st_uid, path.stat().st_gid) == (4321, 8765)


# -- 6. temporary names -------------------------------------------------------------------------


def test_a_file_with_a_name_at_name_max_is_fixed(tmp_path, capsys, monkeypatch):
    name = "m" * 252 + ".py"  # 255 bytes: `.NAME.xxxxxxxx.bnfix` would be 271
    (tmp_path / name).write_text(TORCH_BUG)
    monkeypatch.chdir(tmp_path)
    code, _, err = bnfix_here(capsys, "fix", "--unsafe-fixes", "--no-cache", name)
    assert code == 0 and err == [] and (tmp_path / name).read_text() == FIXED
    assert os.listdir(tmp_path) == [name]


def test_temporary_files_a_killed_run_left_are_cleaned(tmp_path, capsys, monkeypatch):
    (tmp_path / "a.py").write_text(TORCH_BUG)
    old = time.time() - 3600
    left = {".a.py.k3x9_q2z.bnfix": old,  # ours, older than the run: removed
            ".a.py.abcd1234.bnfix": time.time(),  # as new as the run (another run's?): kept
            ".notes.bnfix": old,  # not our pattern
            "a.py.abcd1234.bnfix": old}  # no leading dot: not ours
    for name, mtime in left.items():
        (tmp_path / name).write_text("partial")
        os.utime(tmp_path / name, (mtime, mtime))
    (tmp_path / ".b.py.abcd1234.bnfix").symlink_to(tmp_path / "a.py")  # not a regular file
    elsewhere = tmp_path / "untouched"
    elsewhere.mkdir()
    (elsewhere / ".c.py.abcd1234.bnfix").write_text("partial")
    os.utime(elsewhere / ".c.py.abcd1234.bnfix", (old, old))
    (elsewhere / "clean.py").write_text(TORCH_CLEAN)
    monkeypatch.chdir(tmp_path)
    code, _, err = bnfix_here(capsys, "fix", "--unsafe-fixes", "--no-cache", ".")
    assert code == 0 and err == [] and (tmp_path / "a.py").read_text() == FIXED
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".a.py.abcd1234.bnfix", ".b.py.abcd1234.bnfix", ".notes.bnfix", "a.py",
         "a.py.abcd1234.bnfix", "untouched"])
    assert (elsewhere / ".c.py.abcd1234.bnfix").exists(), "a folder bnfix did not write into"


# -- 7. Ctrl-C during start-up -----------------------------------------------------------------

_INTERRUPT_AT_IMPORT = """
import runpy, signal, sys, time
# Ctrl-C as in a terminal: a job started in the background by a non-interactive shell (a CI
# script) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler
signal.signal(signal.SIGINT, signal.default_int_handler)
TARGET = sys.argv[1]
if TARGET in sys.modules:
    sys.exit(f"{TARGET} is already imported: the hook would never run")
class Hook:
    def find_spec(self, name, path=None, target=None):
        if name == TARGET:
            sys.meta_path.remove(self)
            sys.stderr.write("READY\\n")
            sys.stderr.flush()
            # the test's SIGINT ends this: short sleeps, because a signal that lands between
            # the flush and the start of one long sleep is only acted on when it ends (CPython
            # checks for signals when the sleep call is interrupted, or at the loop's jump)
            for _ in range(6000):
                time.sleep(0.1)
        return None
sys.meta_path.insert(0, Hook())
sys.argv = ["bnfix", *sys.argv[2:]]
if {script}:
    from bnfix.cli import main  # what a console script does
    sys.exit(main())
runpy.run_module("bnfix", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize(("module", "script"), [
    ("bnfix.cli", False), ("argparse", False), ("bnfix.lint", False), ("libcst", False),
    ("argparse", True), ("bnfix.engine", True)])
def test_ctrl_c_while_importing_exits_130_without_a_traceback(tmp_path, module, script):
    (tmp_path / "a.py").write_text(TORCH_BUG)
    code = _INTERRUPT_AT_IMPORT.replace("{script}", str(script))
    proc = subprocess.Popen([sys.executable, "-c", code, module, "fix", "--unsafe-fixes",
                             "--no-cache", "a.py"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    ready = proc.stderr.readline()  # the process says when it is importing `module`
    assert ready == "READY\n", ready + proc.communicate(timeout=60)[1]
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert no_traceback(err) and len(err.splitlines()) == 1 and "interrupted" in err
    assert (tmp_path / "a.py").read_text() == TORCH_BUG


# -- 8. recursion and the parser's limits ---------------------------------------------------------


def test_deep_files_are_one_bn900_line_each_and_the_run_goes_on(tmp_path):
    elifs = "".join(f"elif x == {i}:\n    y = nn.BatchNorm2d(8, momentum=0.9)\n"
                    for i in range(1, 500))
    files = {
        "a_elif.py": TORCH_BUG + "x = 0\nif x == 0:\n    y = 0\n" + elifs,
        "b_sum.py": TORCH_BUG + "z = " + " + ".join(["nn.BatchNorm2d(8)"] * 900) + "\n",
        "c_unary.py": TORCH_BUG + "z = " + "-" * 50_000 + "1\n",
        "d_ok.py": TORCH_BUG,
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    check = bnfix_process("check", "--no-cache", "--output-format", "concise", ".", cwd=tmp_path)
    assert check.returncode == 1 and no_traceback(check.stderr) and check.stderr == ""
    lines = check.stdout.splitlines()
    assert sum(line.startswith("a_elif.py:") and " BN008 " in line for line in lines) == 500
    assert [line for line in lines if line.startswith("b_sum.py")] == [
        "b_sum.py:1:1: BN900 cannot analyse: nested too deeply for bnfix (Python's recursion "
        "limit); simplify the nesting or exclude the file"]
    (c_line,) = [line for line in lines if line.startswith("c_unary.py")]
    assert c_line.startswith("c_unary.py:1:1: BN900 cannot parse: Python's parser ran out of ")
    assert "d_ok.py:2:24: BN008" in check.stdout
    fix = bnfix_process("fix", "--unsafe-fixes", "--no-cache", "--output-format", "concise", ".",
                        cwd=tmp_path)
    assert fix.returncode == 1 and no_traceback(fix.stderr)
    assert fix.stderr == ("bnfix: a_elif.py: fixes dropped: LibCST cannot round-trip the result "
                          "(LibCST: nested too deeply for its parser)\n")
    assert (tmp_path / "a_elif.py").read_text() == files["a_elif.py"]
    assert (tmp_path / "d_ok.py").read_text() == FIXED


# -- 9. an internal error in one file ------------------------------------------------------------


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_an_internal_error_names_the_file_and_the_others_are_checked(tmp_path, capsys,
                                                                     monkeypatch, jobs):
    from bnfix.engine import Engine

    real = Engine.diagnose

    def faulty(self, text, path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if path.endswith("boom.py"):
            raise ValueError("injected fault")
        return real(self, text, path, *args, **kwargs)

    monkeypatch.setattr(Engine, "diagnose", faulty)  # forked workers inherit it
    count = 40 if jobs == "2" else 3  # above the threshold where worker processes start
    for i in range(count):
        (tmp_path / f"m{i:02d}.py").write_text(TORCH_BUG)
    (tmp_path / "boom.py").write_text(TORCH_BUG)
    monkeypatch.chdir(tmp_path)
    code, out, err = bnfix_here(capsys, "check", "--no-cache", "-j", jobs, "--output-format",
                                "concise", ".")
    assert code == 2
    assert sum(" BN008 " in line for line in out.splitlines()) == count and "boom.py" not in out
    assert err == ["bnfix: boom.py: internal error: ValueError: injected fault; the other files "
                   "were checked. Please report it at https://github.com/bnfix/bnfix/issues with "
                   "the file (or a reduced copy); --verbose prints the traceback"]
    code, _, err = bnfix_here(capsys, "check", "--no-cache", "-j", jobs, "--verbose", ".")
    assert code == 2 and err[1] == "Traceback (most recent call last):"
    assert err[-1] == "ValueError: injected fault"


# -- 10. configuration errors ---------------------------------------------------------------------

CONFIG_ERRORS = [
    ('per-file-ignores = {"a.py" = ["BN999"]}',
     '[tool.bnfix] `per-file-ignores` "a.py": unknown rule selector `BN999`'),
    ('select = ["BN0008"]', "[tool.bnfix] `select`: unknown rule selector `BN0008` (did you mean "
                            "`BN008`?)"),
    ('ignore = ["XYZ"]', "[tool.bnfix] `ignore`: unknown rule selector `XYZ`"),
    ('extend-select = ["momentum-conventions"]',
     "[tool.bnfix] `extend-select`: unknown rule selector `momentum-conventions` (did you mean "
     "`momentum-convention`?)"),
    ('select = "BN001"', '[tool.bnfix] `select` must be a list of strings, not "BN001"'),
    ("respect-gitignore = 1", "[tool.bnfix] `respect-gitignore` must be true or false, not 1"),
    ('per-file-ignores = {"a.py" = "BN001"}',
     '[tool.bnfix] `per-file-ignores` "a.py" must be a list of codes, not "BN001"'),
    ("selct = []", "[tool.bnfix] unknown key `selct` (did you mean `select`?)"),
    ("max_file_size = 10", "[tool.bnfix] unknown key `max_file_size` (did you mean "
                           "`max-file-size`?)"),
    ('target-tensorflow = "two"', '[tool.bnfix] `target-tensorflow` must be a version like '
                                  '"2.15", not `two`'),
    ("select = [", "invalid TOML: "),
]


@pytest.mark.parametrize(("table", "message"), CONFIG_ERRORS, ids=[m.split(":")[0][:40] for _, m
                                                                   in CONFIG_ERRORS])
def test_every_configuration_error_is_one_line_with_file_key_and_value(tmp_path, capsys,
                                                                       monkeypatch, table,
                                                                       message):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(f"[tool.bnfix]\n{table}\n")
    (tmp_path / "a.py").write_text(TORCH_BUG)
    monkeypatch.chdir(tmp_path)
    code, out, err = bnfix_here(capsys, "check", ".")
    assert code == 2 and out == "" and len(err) == 1, err
    assert err[0].startswith(f"bnfix: {pyproject}: {message}"), err[0]


@pytest.mark.parametrize(("text", "message"), [
    ("tool = 3\n", "`tool` must be a table, not 3"),
    ("[tool]\nbnfix = [1]\n", "`tool.bnfix` must be a table ([tool.bnfix]), not [1]"),
])
def test_a_tool_table_of_the_wrong_type_is_one_line(tmp_path, capsys, monkeypatch, text, message):
    (tmp_path / "pyproject.toml").write_text(text)
    (tmp_path / "a.py").write_text(TORCH_BUG)
    monkeypatch.chdir(tmp_path)
    code, _, err = bnfix_here(capsys, "check", ".")
    assert code == 2 and err == [f"bnfix: {tmp_path / 'pyproject.toml'}: {message}"]


def test_an_unknown_selector_on_the_command_line_names_the_option(tmp_path, capsys, monkeypatch):
    (tmp_path / "a.py").write_text(TORCH_BUG)
    monkeypatch.chdir(tmp_path)
    code, _, err = bnfix_here(capsys, "check", "--ignore", "BN008,BN9999", ".")
    assert code == 2 and err == ["bnfix: --ignore: unknown rule selector `BN9999` (see `bnfix "
                                 "rules`)"]


# -- 11. files outside the tree ------------------------------------------------------------------


def test_nothing_of_a_file_outside_the_tree_is_printed_or_written(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(f'url = "{SECRET}" +\n')  # a syntax error that echoes
    (outside / "model.py").write_text(TORCH_BUG.replace("\n", f"  # {SECRET}\n", 1))
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "creds.py").symlink_to(outside / "secret.txt")
    (tree / "model.py").symlink_to(outside / "model.py")
    (tree / "sub" / "real.py").write_text(TORCH_BUG)
    (tree / "inside.py").symlink_to(tree / "sub" / "real.py")  # a link inside the tree: checked
    before = digests(outside)
    for command in ("check", "fix"):
        run = bnfix_process(command, "--unsafe-fixes", "--report-all-syntax-errors", "--no-cache",
                            ".", cwd=tree)
        assert run.returncode in (0, 1) and no_traceback(run.stderr)
        assert "hunter2" not in run.stdout + run.stderr, command
        assert sorted(run.stderr.splitlines()) == [
            f"bnfix: {name}: skipped: a symbolic link to a file outside {tree} (name it on the "
            "command line to check it)" for name in ("creds.py", "model.py")]
    assert digests(outside) == before, "a fix wrote outside the tree"
    assert (tree / "sub" / "real.py").read_text() == FIXED
    named = bnfix_process("check", "--output-format", "concise", "--no-cache", "model.py", cwd=tree)
    assert named.returncode == 1 and "model.py:2:24: BN008" in named.stdout  # asked for by name


# -- 12. what check announces as fixable is what fix does ----------------------------------------


@pytest.mark.parametrize("newline", ["\r", "\r\n", "\n"], ids=["CR", "CRLF", "LF"])
def test_check_counts_what_fix_really_fixes(tmp_path, capsys, monkeypatch, newline):
    path = tmp_path / "a.py"
    path.write_bytes(TWO_RULES.replace("\n", newline).encode())
    monkeypatch.chdir(tmp_path)
    code, out, _ = bnfix_here(capsys, "check", "--unsafe-fixes", "--no-cache", "a.py")
    assert code == 1 and out.count(" [*] ") == 2 and "[*] 2 fixable with `--fix`." in out
    code, out, err = bnfix_here(capsys, "fix", "--unsafe-fixes", "--no-cache",
                                "--output-format", "concise", "a.py")
    assert code == 0 and err == [] and "Found 2 errors (2 fixed, 0 remaining)." in out
    fixed = path.read_bytes()
    assert b"momentum=1 - 0.9)" + newline.encode() in fixed
    assert fixed.count(newline.encode()) == TWO_RULES.count("\n")
