"""`bnfix validate fix PATH -- COMMAND`: the seed and torch fixtures run for real (original and
fixed copies, under the probe) and each fixed bug's symptom is measured in both runs; usage
errors, crashing and hanging scripts, the untouched project and the JSON document."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FIXTURES, REPO, has_tf1_layers, run_bnfix, write_tree

BN104_SOURCE = """
    def build():
        import torch.nn as nn

        return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))
"""


def _tree_hash(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _project(root: Path, main: str) -> Path:
    """A tiny project: a BN104 finding bnfix fixes (never run) and a script; BN104 is opt-in,
    so the commands add `--extend-select BN104`."""
    return write_tree(root, {"model.py": BN104_SOURCE, "main.py": main})


# -- usage and failures (fast: no framework runs) ----------------------------------------------
def test_no_command_after_the_separator_is_a_one_line_usage_error(tmp_path: Path):
    run = run_bnfix("validate", "fix", str(_project(tmp_path, "pass\n")), "--")
    assert run.returncode == 2
    expected = ("bnfix: validate fix: no command after `--` (e.g. `bnfix validate fix . -- "
                "python train.py --steps 3`)")
    assert run.stderr.strip().splitlines() == [expected]


def test_missing_path_is_a_one_line_usage_error(tmp_path: Path):
    run = run_bnfix("validate", "fix", str(tmp_path / "nowhere"), "--", "python", "x.py")
    assert run.returncode == 2
    expected = f"bnfix: validate fix: {tmp_path / 'nowhere'} is not a folder"
    assert run.stderr.strip().splitlines() == [expected]


def test_a_crashing_script_exits_2_with_its_stderr_tail(tmp_path: Path):
    project = _project(tmp_path / "p", """
        import sys
        sys.stderr.write("about to fail\\n")
        raise RuntimeError("boom from the user's script")
    """)
    before = _tree_hash(project)
    run = run_bnfix("validate", "fix", str(project), "--extend-select", "BN104",
                    "--no-progress", "--", sys.executable, "main.py")
    assert run.returncode == 2, run.stdout + run.stderr
    assert "the original run exited with 1" in run.stdout
    assert "the fixed run exited with 1" in run.stdout
    assert "RuntimeError: boom from the user's script" in run.stdout
    assert "about to fail" in run.stdout
    assert _tree_hash(project) == before


def test_a_hanging_script_is_killed_with_its_process_group(tmp_path: Path):
    marker = tmp_path / "child.pid"
    project = _project(tmp_path / "p", f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open({str(marker)!r}, "a").write(f"{{child.pid}}\\n")
        time.sleep(120)
    """)
    start = time.monotonic()
    run = run_bnfix("validate", "fix", str(project), "--extend-select", "BN104", "--timeout",
                    "3", "--no-progress", "--", sys.executable, "main.py")
    assert run.returncode == 2, run.stdout + run.stderr
    assert "the original run timed out" in run.stdout
    assert time.monotonic() - start < 60
    time.sleep(0.5)
    for pid in marker.read_text().split():  # the grandchildren died with the group
        assert _dead(int(pid)), pid


def _dead(pid: int) -> bool:
    """Gone, or a zombie nobody reaped yet (a container's init may not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def test_the_environment_sitecustomize_still_runs_and_unrun_findings_are_not_observable(
        tmp_path: Path):
    site = write_tree(tmp_path / "site", {"sitecustomize.py": """
        import os
        os.environ["USER_SITECUSTOMIZE"] = "ran"
    """})
    project = _project(tmp_path / "p", """
        import os, sys
        sys.exit(0 if os.environ.get("USER_SITECUSTOMIZE") == "ran" else 3)
    """)
    out = tmp_path / "out.json"
    run = run_bnfix("validate", "fix", str(project), "--extend-select", "BN104", "--json",
                    str(out), "--no-progress", "--", sys.executable, "main.py",
                    env={"PYTHONPATH": str(site)})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "BN104  model.py:4  not observable: model.py did not run in this command" in run.stdout
    document = json.loads(out.read_text())
    assert document["runs"]["original"]["files"] == ["main.py"]
    assert document["symptoms"][0]["verdict"] == "not observable"


# -- PATH is never changed; the project's configuration and check's line numbers -------------
def _files(root: Path) -> dict[str, bytes]:
    """Every regular file and link under root (links as their targets' text)."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[rel] = ("-> " + os.readlink(path)).encode()
        elif path.is_file():
            out[rel] = path.read_bytes()
    return out


def test_links_inside_path_never_lead_the_fix_outside_the_copies(tmp_path: Path):
    """An absolute link to a file of PATH, a `../outside` link and an absolute link to a folder
    outside: the original tree and the outside stay byte for byte; the command's `--opt=` and
    bare absolute paths into PATH point into the copy."""
    outside = write_tree(tmp_path / "outside", {"other.py": BN104_SOURCE})
    project = _project(tmp_path / "p", """
        import sys
        print("ARGS", sys.argv[1:])
    """)
    (project / "abs_link.py").symlink_to(project / "model.py")
    (project / "up_link.py").symlink_to(Path("..") / "outside" / "other.py")
    (project / "data").symlink_to(outside)
    before = {"project": _files(project), "outside": _files(outside)}
    keep = tmp_path / "keep"
    run = run_bnfix("validate", "fix", str(project), "--extend-select", "BN104", "--keep",
                    str(keep), "--no-progress", "--", sys.executable, "main.py",
                    f"--opt={project}/x", str(project))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    assert {"project": _files(project), "outside": _files(outside)} == before
    assert f"not copied: the link up_link.py -> ../outside/other.py leads outside {project}" \
        in run.stdout
    assert f"not copied: the link data -> {outside} leads outside {project}" in run.stdout
    copy = keep / "fixed"
    assert os.readlink(copy / "abs_link.py") == "model.py"  # relative, inside the copy
    assert not (copy / "up_link.py").exists() and not (copy / "data").exists()
    assert "bias=False" in (copy / "model.py").read_text()  # the fix stayed in the copy
    printed = (keep / "original.stdout").read_text()
    assert f"ARGS ['--opt={keep / 'original'}/x', '{keep / 'original'}']" in printed


def test_keep_inside_path_is_refused(tmp_path: Path):
    project = _project(tmp_path / "p", "pass\n")
    run = run_bnfix("validate", "fix", str(project), "--keep", str(project / "out"), "--",
                    sys.executable, "main.py")
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [(
        f"bnfix: validate fix: --keep {project / 'out'} is inside {project}, which is never "
        "changed")]
    assert not (project / "out").exists()


def test_the_project_configuration_above_path_is_honoured(tmp_path: Path):
    """PATH is a folder of a project whose [tool.bnfix] ignores BN008 (a default rule with a
    fix): nothing to fix, as `bnfix check PATH` says."""
    root = write_tree(tmp_path / "repo", {"pyproject.toml": '[tool.bnfix]\nignore = ["BN008"]\n'})
    project = write_tree(root / "src", {"model.py": "import torch.nn as nn\n"
                                                    "bn = nn.BatchNorm2d(8, momentum=0.9)\n",
                                        "main.py": "pass\n"})
    assert run_bnfix("check", str(project), "--isolated").returncode == 1  # found without it
    assert run_bnfix("check", str(project)).returncode == 0
    run = run_bnfix("validate", "fix", str(project), "--no-progress", "--", sys.executable,
                    "main.py")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().splitlines()[-1] == \
        f"nothing to validate: bnfix fixed nothing in {project} (0 findings)"


def test_fixed_findings_are_reported_at_checks_line_numbers(tmp_path: Path):
    """The seed's BN002 is fixed in a later round than BN006, whose fix adds two lines above
    it: validate fix reports it where `bnfix check` does."""
    project = tmp_path / "seed"
    project.mkdir()
    shutil.copy(FIXTURES / "seed000" / "multi_gpu_train.py", project)
    check = run_bnfix("check", "--output-format", "json", str(project))
    rows = {(r["code"], r["location"]["row"]) for r in json.loads(check.stdout)}
    out = tmp_path / "out.json"
    run = run_bnfix("validate", "fix", str(project), "--json", str(out), "--no-progress", "--",
                    sys.executable, "-c", "pass")
    assert run.returncode == 0, run.stdout + run.stderr
    document = json.loads(out.read_text())
    fixed = {(f["code"], f["row"]) for f in document["fixed"]}
    assert ("BN002", 115) in rows and fixed == rows


# -- the fixtures, run for real ----------------------------------------------------------------
JOBS = {
    "multi_gpu": ("seed000", ["python", "multi_gpu_train.py", "--num-gpus", "2", "--device",
                              "cpu", "--steps", "3"]),
    "single_gpu": ("seed000", ["python", "single_gpu_finetune.py", "--steps", "3"]),
    "seg": ("torch_training", ["python", "seg_trainer.py", "--epochs", "2", "--freeze-bn"]),
    "ddp": ("torch_training", ["python", "ddp_train.py", "--world-size", "2", "--epochs", "1"]),
    "ddp_sync": ("multi_device", ["python", "ddp_segmentation.py", "--world-size", "2",
                                  "--steps", "3"]),
}


@pytest.fixture(scope="module")
def validations(tmp_path_factory) -> dict[str, dict]:
    """The five validations at once (each runs its two copies concurrently)."""
    pytest.importorskip("torch")
    if not has_tf1_layers():
        pytest.skip("needs tensorflow and tf-keras")
    root = tmp_path_factory.mktemp("validate_fix")
    env = {**os.environ, "PYTHONIOENCODING": "utf-8", "TF_CPP_MIN_LOG_LEVEL": "2",
           "CUDA_VISIBLE_DEVICES": ""}
    env.pop("MASTER_PORT", None)
    procs = {}
    for name, (fixture, command) in JOBS.items():
        project = root / name
        shutil.copytree(FIXTURES / fixture, project)
        out = root / f"{name}.json"
        args = [sys.executable, "-m", "bnfix", "validate", "fix", str(project), "--json",
                str(out), "--no-progress"]
        if name == "ddp":  # BN104 (opt-in) has a symptom this run measures
            args += ["--plot", str(root / "ddp.png"), "--extend-select", "BN104"]
        procs[name] = (subprocess.Popen([*args, "--", *command], cwd=root, env=env, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE),
                       project, _tree_hash(project), out)
    results = {}
    for name, (proc, project, digest, out) in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        results[name] = {"rc": proc.returncode, "stdout": stdout, "stderr": stderr,
                         "unchanged": _tree_hash(project) == digest,
                         "json": json.loads(out.read_text()) if out.exists() else None,
                         "plot": root / "ddp.png"}
    return results


def _symptoms(result: dict) -> dict[str, dict]:
    return {s["code"]: s for s in result["json"]["symptoms"]}


@pytest.mark.slow
@pytest.mark.tf
def test_seed_multi_tower_symptoms_gone(validations):
    result = validations["multi_gpu"]
    assert result["rc"] == 0, result["stdout"] + result["stderr"]
    assert result["unchanged"]
    s = _symptoms(result)
    assert s["BN001"]["verdict"] == "gone"
    assert s["BN001"]["original"]["figure"] == 0.0 and s["BN001"]["fixed"]["figure"] > 1e-3
    assert s["BN004"]["verdict"] == "gone"
    assert (s["BN004"]["original"]["figure"], s["BN004"]["fixed"]["figure"]) == (6.0, 0.0)
    assert s["BN006"]["verdict"] == "gone"
    assert s["BN006"]["original"]["figure"] < 1e-4
    assert s["BN006"]["fixed"]["figure"] > 1e-2
    # tf-keras adds no update ops for the original's trainable=False BN: nothing to duplicate
    assert s["BN002"]["verdict"] == "not observable"
    assert "UPDATE_OPS holds 0 ops" in s["BN002"]["reason"]
    assert s["BN002"]["fixed"]["figure"] == 1.0
    assert s["BN003"]["verdict"] == "not observable"  # single_gpu_finetune.py did not run
    assert "gamma/beta of 3 BN layers unchanged after 3 steps" in result["stdout"]


@pytest.mark.slow
@pytest.mark.tf
def test_seed_single_device_bn003_gone(validations):
    result = validations["single_gpu"]
    assert result["rc"] == 0, result["stdout"] + result["stderr"]
    bn003 = _symptoms(result)["BN003"]
    assert bn003["verdict"] == "gone"
    assert bn003["original"]["figure"] == 0.0 and bn003["fixed"]["figure"] > 1e-3
    assert "stay at their initial values after 3 steps" in bn003["original"]["text"]


@pytest.mark.slow
def test_frozen_bn_symptom_gone_in_seg_trainer(validations):
    result = validations["seg"]
    assert result["rc"] == 0, result["stdout"] + result["stderr"]
    assert result["unchanged"]
    s = _symptoms(result)
    for code in ("BN105", "BN102"):
        assert s[code]["verdict"] == "gone"
        assert s[code]["original"]["figure"] > 1e-3 and s[code]["fixed"]["figure"] == 0.0
    assert s["BN101"]["reason"] == "ddp_train.py did not run in this command"
    assert result["json"]["runs"]["original"]["probe_errors"] == []


@pytest.mark.slow
def test_ddp_eval_and_bias_symptoms_gone(validations):
    result = validations["ddp"]
    assert result["rc"] == 0, result["stdout"] + result["stderr"]
    s = _symptoms(result)
    assert s["BN101"]["verdict"] == "gone"
    assert s["BN101"]["original"]["figure"] > 1e-4 and s["BN101"]["fixed"]["figure"] == 0.0
    assert s["BN104"]["verdict"] == "gone"
    assert (s["BN104"]["original"]["figure"], s["BN104"]["fixed"]["figure"]) == (2.0, 0.0)
    # --sync-bn defaults to off on CPU: the conversion BN103 moves never runs
    assert s["BN103"]["verdict"] == "not observable"
    assert "did not run in this command" in s["BN103"]["reason"]
    assert result["plot"].stat().st_size > 10_000


@pytest.mark.slow
def test_ddp_ranks_share_running_stats_after_the_bn006_fix(validations):
    result = validations["ddp_sync"]
    assert result["rc"] == 0, result["stdout"] + result["stderr"]
    bn006 = _symptoms(result)["BN006"]
    assert bn006["verdict"] == "gone"
    assert bn006["original"]["figure"] > 1e-3 and bn006["fixed"]["figure"] < 1e-6


@pytest.mark.slow
@pytest.mark.tf
def test_json_document_shape(validations):
    document = validations["multi_gpu"]["json"]
    assert set(document) == {"path", "command", "exit_code", "wall_s", "findings", "fixed",
                             "remaining", "runs", "symptoms"}
    assert document["command"][:2] == ["python", "multi_gpu_train.py"]
    assert [f["code"] for f in document["findings"]] == ["BN001", "BN006", "BN002", "BN004",
                                                         "BN003"]
    run = document["runs"]["fixed"]
    assert set(run) == {"returncode", "timed_out", "wall_s", "stderr_tail", "probe_errors",
                        "files", "trajectories"}
    assert run["files"] == ["multi_gpu_train.py"] and run["probe_errors"] == []
    gamma = run["trajectories"]["bn_conv1/BatchNorm/bn"]["gamma"]
    assert len(gamma) == 4 and gamma[0] == 1.0 and gamma[-1] != 1.0  # initial + 3 steps
    symptom = document["symptoms"][0]
    assert set(symptom) == {"code", "path", "row", "message", "verdict", "reason", "original",
                            "fixed"}
    assert set(symptom["original"]) == {"present", "figure", "text"}


def test_validate_fix_leaves_the_lint_path_framework_free():
    code = ("import sys, bnfix.validate.command, bnfix.validate.arguments; "
            "print(sorted(m for m in ('torch', 'tensorflow', 'keras', 'numpy') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         check=True)
    assert out.stdout.strip() == "[]"
