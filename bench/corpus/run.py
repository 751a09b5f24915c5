"""The real-code harness: bnfix on public training code bases, every finding against a judgment.

    python bench/corpus/run.py                       # every code base in codebases.toml
    python bench/corpus/run.py timm facenet          # some of them
    python bench/corpus/run.py --no-fix              # findings only (no `fix` pass)
    python bench/corpus/run.py --sheet todo.tsv      # unjudged findings, with their code, to judge

Code bases are obtained into a cache folder outside the repository (`--cache`, default
~/.cache/bnfix-corpus): pip entries with `pip download --no-deps` at their pinned version, github
entries from a git directory of the repository holding the pinned commit (`--mirrors`, laid out
as `<owner>+<name>/repo`, or `git clone` with `--clone` where the network allows). Only Python
sources and the files that pin versions are extracted.

For each code base, `bnfix check --select ALL --output-format json` runs on it, and every finding
is looked up in judgments.tsv (code base, file, line, code → true / false / debatable, and the
verdict on its fix: correct / harmless / wrong). The report: per-rule counts and precision
(true / (true + false), debatable apart), findings without a judgment (to be judged, never
accepted automatically), judged findings that no longer appear. Then `bnfix fix --select ALL
--unsafe-fixes` runs on a copy and each changed file is checked: it parses, a second `fix` changes
nothing, and the verdicts of the fixes applied to it; a fix judged wrong, a file that no longer
parses, a second pass that changes more, or a finding offered as fixable that `fix` leaves behind
are failing rows. Exit status 1 when a default rule is below 90% precision or a row fails.
"""

from __future__ import annotations

import argparse
import ast
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import tomllib

HERE = Path(__file__).resolve().parent
CODEBASES = HERE / "codebases.toml"
JUDGMENTS = HERE / "judgments.tsv"
COLUMNS = ("codebase", "file", "line", "code", "verdict", "fix", "reason")
VERDICTS = ("true", "false", "debatable")
FIX_VERDICTS = ("", "correct", "harmless", "wrong")
PRECISION_GOAL = 0.9
# What is extracted: the Python sources and the files that say which framework versions the
# project pins (bnfix reads them for the target TensorFlow version).
KEEP_NAMES = ("setup.py", "setup.cfg", "pyproject.toml", ".gitignore")
MAX_FILE_BYTES = 4 << 20
BNFIX = [sys.executable, "-m", "bnfix"]


@dataclass(frozen=True)
class Codebase:
    name: str
    frameworks: tuple[str, ...]
    pip: str | None = None
    github: str | None = None
    commit: str | None = None

    @property
    def version(self) -> str:
        return self.pip or f"{self.github}@{self.commit}"


@dataclass(frozen=True)
class Judgment:
    codebase: str
    file: str
    line: int
    code: str
    verdict: str
    fix: str
    reason: str

    @property
    def key(self) -> tuple[str, str, int, str]:
        return (self.codebase, self.file, self.line, self.code)


@dataclass
class Finding:
    codebase: str
    file: str
    line: int
    code: str
    message: str
    fixable: bool

    @property
    def key(self) -> tuple[str, str, int, str]:
        return (self.codebase, self.file, self.line, self.code)


@dataclass
class FixRow:
    codebase: str
    file: str
    parses: bool
    idempotent: bool
    fixes: list[tuple[Finding, str]] = field(default_factory=list)  # (finding, fix verdict)

    @property
    def failing(self) -> bool:
        return not self.parses or not self.idempotent or any(v in ("wrong", "") for _, v in self.fixes)


# -- the corpus ------------------------------------------------------------------------------


def load_codebases(path: Path = CODEBASES) -> list[Codebase]:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    out = []
    for entry in data["codebase"]:
        if ("pip" in entry) == ("github" in entry) or ("github" in entry and "commit" not in entry):
            raise SystemExit(f"{path}: `{entry.get('name')}` needs either pip, or github + commit")
        out.append(Codebase(entry["name"], tuple(entry.get("frameworks", ())), entry.get("pip"),
                            entry.get("github"), entry.get("commit")))
    names = [c.name for c in out]
    if len(set(names)) != len(names):
        raise SystemExit(f"{path}: code base names must be unique")
    return out


def load_judgments(path: Path = JUDGMENTS) -> dict[tuple[str, str, int, str], Judgment]:
    if not path.exists():
        return {}
    out = {}
    with path.open(encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh, delimiter="\t")
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise SystemExit(f"{path}: the columns must be {', '.join(COLUMNS)}")
        for n, row in enumerate(reader, start=2):
            if row["verdict"] not in VERDICTS or row["fix"] not in FIX_VERDICTS:
                raise SystemExit(f"{path}:{n}: verdict must be one of {VERDICTS} and fix one of "
                                 f"{FIX_VERDICTS[1:]} or empty")
            if not row["reason"].strip():
                raise SystemExit(f"{path}:{n}: every judgment gives its reason")
            judgment = Judgment(row["codebase"], row["file"], int(row["line"]), row["code"],
                                row["verdict"], row["fix"], row["reason"])
            if judgment.key in out:
                raise SystemExit(f"{path}:{n}: a second judgment of {judgment.key}")
            out[judgment.key] = judgment
    return out


def _keep(name: str) -> bool:
    base = PurePosixPath(name).name
    return base.endswith(".py") or base in KEEP_NAMES or (
        base.startswith("requirements") and base.endswith(".txt"))


def _safe_member(name: str) -> PurePosixPath | None:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts:
        return None
    return path


def _extract_archive(archive: Path, dest: Path) -> None:
    """A wheel (as is) or an sdist (its top folder stripped): kept files only."""
    def write(name: str, data: bytes, strip: bool) -> None:
        path = _safe_member(name)
        if path is None or not _keep(name) or ".dist-info/" in name:
            return
        parts = path.parts[1:] if strip else path.parts
        if not parts:
            return
        target = dest.joinpath(*parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    if archive.suffix == ".whl" or (archive.suffix == ".zip"):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                if not info.is_dir() and info.file_size <= MAX_FILE_BYTES:
                    write(info.filename, zf.read(info), strip=archive.suffix == ".zip")
        return
    with tarfile.open(archive) as tf:
        for member in tf.getmembers():
            if member.isfile() and member.size <= MAX_FILE_BYTES:
                handle = tf.extractfile(member)
                if handle is not None:
                    write(member.name, handle.read(), strip=True)


def _download(codebase: Codebase, cache: Path) -> Path:
    folder = cache / "downloads" / codebase.name
    folder.mkdir(parents=True, exist_ok=True)
    existing = sorted(folder.iterdir())
    if existing:
        return existing[0]
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                           codebase.pip or "", "-d", str(folder)], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{codebase.name}: pip download {codebase.pip} failed:\n{proc.stderr}")
    return min(folder.iterdir())


def _git_dir(codebase: Codebase, mirrors: Path | None, cache: Path, clone: bool) -> Path | None:
    owner, name = (codebase.github or "").split("/")
    if mirrors is not None:
        repo = mirrors / f"{owner}+{name}" / "repo"
        for candidate in (repo / ".git", repo):
            if (candidate / "objects").is_dir():
                return candidate
    if not clone:
        return None
    target = cache / "clones" / f"{owner}+{name}.git"
    if not target.exists():
        subprocess.run(["git", "clone", "--bare", "--quiet",
                        f"https://github.com/{owner}/{name}.git", str(target)], check=True)
    return target


def _extract_commit(git_dir: Path, commit: str, dest: Path) -> None:
    """The kept files of `commit`; blobs the git directory lacks (large files of a shallow
    snapshot) are skipped."""
    listing = subprocess.run(["git", f"--git-dir={git_dir}", "ls-tree", "-r", "-z", "-l", commit],
                             capture_output=True, check=True).stdout.decode("utf-8", "replace")
    wanted: list[tuple[str, str]] = []
    for entry in listing.split("\0"):
        if not entry:
            continue
        meta, _, path = entry.partition("\t")
        mode, kind, sha, size = meta.split()
        if kind == "blob" and mode != "120000" and _keep(path) and _safe_member(path) and \
                size.isdigit() and int(size) <= MAX_FILE_BYTES:
            wanted.append((sha, path))
    batch = subprocess.run(["git", f"--git-dir={git_dir}", "cat-file", "--batch"],
                           input="".join(f"{sha}\n" for sha, _ in wanted).encode(),
                           capture_output=True, check=True).stdout
    stream = io.BytesIO(batch)
    for sha, path in wanted:
        header = stream.readline().decode().split()
        if len(header) < 3 or header[1] == "missing":
            continue
        data = stream.read(int(header[2]))
        stream.read(1)
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def obtain(codebase: Codebase, cache: Path, mirrors: Path | None, clone: bool) -> Path | None:
    """The code base's folder in the cache (extracted once per pinned version), or None."""
    dest = cache / "src" / codebase.name
    stamp = dest / ".bnfix-corpus-version"
    if stamp.exists() and stamp.read_text() == codebase.version:
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    if codebase.pip:
        _extract_archive(_download(codebase, cache), dest)
    else:
        git_dir = _git_dir(codebase, mirrors, cache, clone)
        if git_dir is None:
            shutil.rmtree(dest)
            return None
        _extract_commit(git_dir, codebase.commit or "HEAD", dest)
    stamp.write_text(codebase.version)
    return dest


# -- running bnfix ---------------------------------------------------------------------------


def check(codebase: Codebase, root: Path) -> tuple[list[Finding], float]:
    started = time.perf_counter()
    proc = subprocess.run([*BNFIX, "check", "--select", "ALL", "--output-format", "json",
                           "--no-cache", "--exit-zero", "--no-progress", "."],
                          cwd=root, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{codebase.name}: bnfix check failed ({proc.returncode}):\n{proc.stderr}")
    out = []
    for record in json.loads(proc.stdout or "[]"):
        fix = record.get("fix") or {}
        fixable = fix.get("applicability") in ("safe", "unsafe") and bool(fix.get("edits"))
        out.append(Finding(codebase.name, _relative(record["filename"], root),
                           record["location"]["row"], record["code"], record["message"], fixable))
    return out, elapsed


def _relative(filename: str, root: Path) -> str:
    path = Path(filename)
    if path.is_absolute():
        path = path.relative_to(root)
    return path.as_posix().removeprefix("./")


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in root.rglob("*.py") if p.is_file() and not p.is_symlink()}


def fix_pass(codebase: Codebase, root: Path, findings: list[Finding],
             judgments: dict[tuple[str, str, int, str], Judgment]) -> tuple[list[FixRow], list[Finding]]:
    """`bnfix fix --unsafe-fixes` on a copy: a row per changed file, and the findings offered as
    fixable that the fix left in place."""
    command = [*BNFIX, "check", "--fix", "--select", "ALL", "--unsafe-fixes", "--no-cache",
               "--exit-zero", "--no-progress", "--output-format", "json", "."]
    with tempfile.TemporaryDirectory(prefix=f"bnfix-corpus-{codebase.name}-") as tmp:
        copy = Path(tmp) / codebase.name
        shutil.copytree(root, copy, symlinks=True)
        before = _snapshot(copy)
        first = subprocess.run(command, cwd=copy, capture_output=True, text=True, check=False)
        after = _snapshot(copy)
        second = subprocess.run(command, cwd=copy, capture_output=True, text=True, check=False)
        again = _snapshot(copy)
    for proc in (first, second):
        if proc.returncode != 0:
            raise SystemExit(f"{codebase.name}: bnfix fix failed ({proc.returncode}):\n{proc.stderr}")
    by_file: dict[str, list[Finding]] = defaultdict(list)
    for finding in findings:
        if finding.fixable:
            by_file[finding.file].append(finding)
    rows = []
    for name in sorted(n for n in after if before.get(n) != after[n]):
        try:
            ast.parse(after[name])
            parses = True
        except (SyntaxError, ValueError):
            parses = False
        row = FixRow(codebase.name, name, parses, again.get(name) == after[name])
        for finding in by_file.get(name, []):
            judgment = judgments.get(finding.key)
            row.fixes.append((finding, judgment.fix if judgment else ""))
        rows.append(row)
    left = []
    for record in json.loads(first.stdout or "[]"):
        fix = record.get("fix") or {}
        if fix.get("applicability") in ("safe", "unsafe") and fix.get("edits"):
            left.append(Finding(codebase.name, _relative(record["filename"], copy),
                                record["location"]["row"], record["code"], record["message"], True))
    return rows, left


def default_rules() -> dict[str, bool]:
    """Rule code -> enabled by default (from `bnfix rules --output-format json`)."""
    proc = subprocess.run([*BNFIX, "rules", "--output-format", "json"], capture_output=True,
                          text=True, check=True)
    return {r["code"]: bool(r.get("default", True)) for r in json.loads(proc.stdout)}


# -- the report ------------------------------------------------------------------------------


def precision_table(findings: list[Finding], judgments: dict[tuple[str, str, int, str], Judgment],
                    defaults: dict[str, bool]) -> tuple[list[str], list[str]]:
    """The per-rule table, and the default rules below the precision goal."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for finding in findings:
        judgment = judgments.get(finding.key)
        counts[finding.code][judgment.verdict if judgment else "unjudged"] += 1
    lines = [(f"{'rule':<7} {'default':<8} {'findings':>8} {'true':>5} {'false':>6} "
             f"{'debatable':>9} {'unjudged':>8} {'precision':>9}")]
    below = []
    for code in sorted(counts):
        c = counts[code]
        judged = c["true"] + c["false"]
        precision = c["true"] / judged if judged else None
        shown = f"{precision:.0%}" if precision is not None else "-"
        default = defaults.get(code, True)
        lines.append(f"{code:<7} {'yes' if default else 'opt-in':<8} {sum(c.values()):>8} "
                     f"{c['true']:>5} {c['false']:>6} {c['debatable']:>9} {c['unjudged']:>8} "
                     f"{shown:>9}")
        if default and precision is not None and precision < PRECISION_GOAL:
            below.append(f"{code} {precision:.0%}")
    total = Counter()
    for c in counts.values():
        total.update(c)
    judged = total["true"] + total["false"]
    lines.append(f"{'all':<7} {'':<8} {sum(total.values()):>8} {total['true']:>5} "
                 f"{total['false']:>6} {total['debatable']:>9} {total['unjudged']:>8} "
                 f"{(total['true'] / judged if judged else 0):>9.0%}")
    return lines, below


def write_sheet(path: Path, findings: list[Finding], roots: dict[str, Path]) -> None:
    """Unjudged findings with the code around them: a worksheet for the judge."""
    with path.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
        writer.writerow([*COLUMNS, "message", "context"])
        for f in findings:
            lines = (roots[f.codebase] / f.file).read_text(encoding="utf-8", errors="replace").splitlines()
            context = " ⏎ ".join(lines[max(0, f.line - 3):f.line + 2])
            writer.writerow([f.codebase, f.file, f.line, f.code, "", "", "", f.message, context])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="code bases to run (default: all)")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "bnfix-corpus")
    parser.add_argument("--mirrors", type=Path, default=Path(os.environ.get(
        "BNFIX_CORPUS_MIRRORS", "/work/.mirror")), help="git directories as <owner>+<name>/repo")
    parser.add_argument("--clone", action="store_true", help="git clone what --mirrors lacks")
    parser.add_argument("--no-fix", dest="fix", action="store_false", help="skip the fix pass")
    parser.add_argument("--sheet", type=Path, help="write the unjudged findings here (TSV)")
    parser.add_argument("--json", type=Path, help="write every finding and fix row here")
    args = parser.parse_args(argv)

    codebases = load_codebases()
    if args.names:
        unknown = set(args.names) - {c.name for c in codebases}
        if unknown:
            parser.error(f"unknown code bases: {', '.join(sorted(unknown))}")
        codebases = [c for c in codebases if c.name in args.names]
    judgments = load_judgments()
    defaults = default_rules()
    findings: list[Finding] = []
    fix_rows: list[FixRow] = []
    left_behind: list[Finding] = []
    roots: dict[str, Path] = {}
    missing = []
    print(f"{'code base':<36} {'frameworks':<12} {'files':>6} {'findings':>8} {'check s':>8}")
    for codebase in codebases:
        root = obtain(codebase, args.cache, args.mirrors, args.clone)
        if root is None:
            missing.append(codebase.name)
            print(f"{codebase.name:<36} not available: no git directory for {codebase.version} "
                  "(use the fetch tool, --mirrors, or --clone)")
            continue
        roots[codebase.name] = root
        found, elapsed = check(codebase, root)
        findings.extend(found)
        files = sum(1 for _ in root.rglob("*.py"))
        print(f"{codebase.name:<36} {','.join(codebase.frameworks):<12} {files:>6} "
              f"{len(found):>8} {elapsed:>8.1f}")
        if args.fix and any(f.fixable for f in found):
            rows, left = fix_pass(codebase, root, found, judgments)
            fix_rows.extend(rows)
            left_behind.extend(left)

    print("\nPrecision by rule (true / (true + false); debatable apart):")
    table, below = precision_table(findings, judgments, defaults)
    print("\n".join(table))
    unjudged = [f for f in findings if f.key not in judgments]
    seen = {f.key for f in findings}
    ran = {c.name for c in codebases} - set(missing)
    gone = [j for j in judgments.values() if j.codebase in ran and j.key not in seen]
    print(f"\nUnjudged findings: {len(unjudged)}")
    for f in unjudged:
        print(f"  {f.codebase}:{f.file}:{f.line} {f.code} {f.message[:140]}")
    print(f"\nJudged findings that no longer appear: {len(gone)}")
    for j in sorted(gone, key=lambda j: j.key):
        print(f"  {j.codebase}:{j.file}:{j.line} {j.code} (was {j.verdict}: {j.reason[:100]})")
    if args.fix:
        print(f"\nFiles changed by `fix --unsafe-fixes`: {len(fix_rows)}")
        for row in fix_rows:
            verdicts = ", ".join(f"{f.code}@{f.line}={v or 'UNJUDGED'}" for f, v in row.fixes)
            state = "FAIL" if row.failing else "ok"
            print(f"  {state:<4} {row.codebase}:{row.file} parses={row.parses} "
                  f"idempotent={row.idempotent} {verdicts}")
        wrong = sum(1 for r in fix_rows for _, v in r.fixes if v == "wrong")
        print(f"  wrong fixes: {wrong}; files that do not parse: "
              f"{sum(not r.parses for r in fix_rows)}; not idempotent: "
              f"{sum(not r.idempotent for r in fix_rows)}")
        print(f"\nFindings offered as fixable that `fix` left in place: {len(left_behind)}")
        for f in left_behind:
            print(f"  {f.codebase}:{f.file}:{f.line} {f.code}")
    if args.sheet:
        write_sheet(args.sheet, unjudged, roots)
        print(f"\nworksheet: {args.sheet}")
    if args.json:
        args.json.write_text(json.dumps({
            "findings": [f.__dict__ for f in findings],
            "fix_rows": [{"codebase": r.codebase, "file": r.file, "parses": r.parses,
                          "idempotent": r.idempotent,
                          "fixes": [[f.code, f.line, v] for f, v in r.fixes]} for r in fix_rows],
        }, indent=1))
    failing = below or unjudged or any(r.failing for r in fix_rows) or left_behind
    if below:
        print(f"\nDefault rules below {PRECISION_GOAL:.0%}: {', '.join(below)}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
