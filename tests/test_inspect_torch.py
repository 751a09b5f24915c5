"""`bnfix inspect` on real PyTorch artifacts written by the tests: trained vs untrained, frozen BN
(BN202), statistics never updated (BN201), DDP keys, nested training checkpoints, safetensors,
a training-mode ONNX export (BN206), and the CLI's output formats over them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_bnfix

torch = pytest.importorskip("torch")
nn = torch.nn

from bnfix.artifacts.inspect import inspect_paths


class Net(nn.Module):
    """Conv -> BN -> ReLU, plus a GroupNorm whose weight/bias must not be taken for a BN."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.gn = nn.GroupNorm(2, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x):  # type: ignore[no-untyped-def]
        x = torch.relu(self.gn(self.bn(self.conv(x))))
        return self.head(x.mean(dim=(2, 3)))


def train(steps: int, *, freeze_bn: bool = False, eval_mode: bool = False):
    """A Net after `steps` SGD steps, and its optimizer."""
    torch.manual_seed(0)
    model = Net()
    if freeze_bn:
        for p in list(model.bn.parameters()) + list(model.gn.parameters()):
            p.requires_grad = False
    model.train(not eval_mode)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1,
                          momentum=0.9)
    for _ in range(steps):
        x = torch.randn(8, 3, 6, 6) * 2 + 0.5
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, opt


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("torch_artifacts")
    untrained, _ = train(0)
    torch.save(untrained.state_dict(), root / "untrained.pt")
    healthy, _ = train(3)
    torch.save(healthy.state_dict(), root / "healthy.pth")
    frozen, _ = train(3, freeze_bn=True)
    torch.save(frozen.state_dict(), root / "frozen.pt")
    # trained with the whole model in eval mode: BN never updated its statistics
    evaluated, opt = train(3, eval_mode=True)
    torch.save({"model": evaluated.state_dict(), "optimizer": opt.state_dict(), "epoch": 3},
               root / "eval_mode.ckpt")
    # the same, the state dict alone: gamma/beta moved are the only evidence of training
    torch.save(evaluated.state_dict(), root / "eval_mode_weights.pt")
    # statistics reset after training (num_batches_tracked stays 3)
    reset, _ = train(3)
    reset.bn.running_mean.zero_()
    reset.bn.running_var.fill_(1.0)
    torch.save(reset.state_dict(), root / "reset.pt")
    # DDP-wrapped frozen model, Lightning-style nesting of a healthy one
    torch.save({f"module.{k}": v for k, v in frozen.state_dict().items()}, root / "ddp.pt")
    _, healthy_opt = train(3)
    torch.save({"state_dict": {f"model.{k}": v for k, v in healthy.state_dict().items()},
                "global_step": 3, "optimizer_states": [healthy_opt.state_dict()]},
               root / "lightning.ckpt")
    broken = {k: v.clone() for k, v in healthy.state_dict().items()}
    broken["bn.running_var"][0] = -1.0
    broken["bn.running_mean"][1] = float("nan")
    torch.save(broken, root / "broken.pt")
    from safetensors.torch import save_file

    save_file(frozen.state_dict(), str(root / "frozen.safetensors"))
    save_file(healthy.state_dict(), str(root / "healthy.safetensors"))
    return root


def findings(path: Path, **kwargs) -> list[tuple[str, str]]:
    result = inspect_paths([str(path)], **kwargs)
    return sorted((f.code, f.layer) for f in result.findings)


def test_untrained_and_healthy_artifacts_are_clean(artifacts):
    for name in ("untrained.pt", "healthy.pth", "healthy.safetensors", "lightning.ckpt"):
        assert findings(artifacts / name) == [], name


def test_only_batchnorm_is_grouped_not_groupnorm(artifacts):
    (artifact,) = inspect_paths([str(artifacts / "healthy.pth")]).artifacts
    assert [layer.name for layer in artifact.layers] == ["bn"]
    layer = artifact.layers[0]
    assert layer.channels == 4 and layer.num_batches_tracked == 3
    assert artifact.trained is True and artifact.trained_evidence == "num_batches_tracked = 3"
    untrained = inspect_paths([str(artifacts / "untrained.pt")]).artifacts[0]
    assert untrained.trained is False


def test_frozen_bn_is_affine_never_trained(artifacts):
    assert findings(artifacts / "frozen.pt") == [("BN202", "bn")]
    result = inspect_paths([str(artifacts / "frozen.pt")])
    message = result.findings[0].message
    assert message.startswith("bn: gamma all 1 and beta all 0 (their initial values) after 3 "
                              "batches (num_batches_tracked)")
    assert "requires_grad=False" in message and "BN105" in message


def test_eval_mode_training_leaves_stats_at_init(artifacts):
    result = inspect_paths([str(artifacts / "eval_mode.ckpt")])
    assert [(f.code, f.layer) for f in result.findings] == [("BN201", "bn")]
    artifact = result.artifacts[0]
    assert artifact.notes == ["state dict under 'model'"]
    assert "optimizer state for 7 parameters ('optimizer')" in artifact.trained_evidence
    assert "running_mean is all 0 and running_var all 1" in result.findings[0].message


def test_eval_mode_training_without_optimizer_state_is_still_bn201(artifacts):
    """num_batches_tracked = 0 with gamma/beta moved off their per-layer constants: trained with
    BN in eval mode, not untrained (the state dict holds no other evidence)."""
    result = inspect_paths([str(artifacts / "eval_mode_weights.pt")])
    assert [(f.code, f.layer) for f in result.findings] == [("BN201", "bn")]
    (artifact,) = result.artifacts
    assert artifact.trained and artifact.trained_evidence == (
        "gamma/beta moved from their initial values (bn) while num_batches_tracked = 0")
    untrained = inspect_paths([str(artifacts / "untrained.pt")]).artifacts[0]
    assert untrained.trained is False  # constant gamma/beta: really untrained


def test_reset_statistics_after_training(artifacts):
    result = inspect_paths([str(artifacts / "reset.pt")])
    assert [(f.code, f.layer) for f in result.findings] == [("BN201", "bn")]
    assert "after 3 batches (num_batches_tracked)" in result.findings[0].message


def test_ddp_prefix_is_stripped(artifacts):
    result = inspect_paths([str(artifacts / "ddp.pt")])
    artifact = result.artifacts[0]
    assert artifact.distributed is True
    assert [layer.name for layer in artifact.layers] == ["bn"]
    assert [(f.code, f.layer) for f in result.findings] == [("BN202", "bn")]


def test_nested_lightning_checkpoint(artifacts):
    artifact = inspect_paths([str(artifacts / "lightning.ckpt")]).artifacts[0]
    assert [layer.name for layer in artifact.layers] == ["model.bn"]
    assert artifact.trained and "global_step = 3" in artifact.trained_evidence


def test_safetensors_are_read_without_torch_load(artifacts):
    assert findings(artifacts / "frozen.safetensors") == [("BN202", "bn")]
    artifact = inspect_paths([str(artifacts / "frozen.safetensors")]).artifacts[0]
    state = torch.load(artifacts / "frozen.pt", weights_only=True)
    assert artifact.layers[0].var.tolist() == pytest.approx(state["bn.running_var"].tolist())


def test_degenerate_statistics(artifacts):
    result = inspect_paths([str(artifacts / "broken.pt")])
    assert [(f.code, f.layer) for f in result.findings] == [("BN207", "bn")]
    message = result.findings[0].message
    assert "non-finite values (1 running_mean)" in message
    assert "1 of 4 channels with running_var <= 0 (min -1)" in message


def test_ignore_and_select(artifacts):
    assert findings(artifacts / "frozen.pt", ignore=["BN202"]) == []
    assert findings(artifacts / "frozen.pt", select=["BN201"]) == []
    assert findings(artifacts / "frozen.pt", select=["affine-never-trained"]) == [("BN202", "bn")]


def test_onnx_export_in_training_mode(artifacts, tmp_path):
    pytest.importorskip("onnx")
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    path = tmp_path / "train_mode.onnx"
    model.train()
    torch.onnx.export(model, (torch.randn(2, 3, 8, 8),), str(path), dynamo=False,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    codes = [code for code, _ in findings(path)]
    assert "BN206" in codes


# -- the CLI as a user runs it -------------------------------------------------------------

JSON_KEYS = {"code", "name", "filename", "location", "end_location", "message", "noqa_row",
             "url", "severity", "fix", "related", "layer"}


def test_cli_json_over_a_folder(artifacts):
    run = run_bnfix("inspect", str(artifacts), "--output-format", "json")
    assert run.returncode == 1, run.stderr
    records = json.loads(run.stdout)
    assert all(set(r) == JSON_KEYS for r in records)
    got = sorted((Path(r["filename"]).name, r["code"], r["layer"]) for r in records)
    assert got == [
        ("broken.pt", "BN207", "bn"),
        ("ddp.pt", "BN202", "bn"),
        ("eval_mode.ckpt", "BN201", "bn"),
        ("eval_mode_weights.pt", "BN201", "bn"),
        ("frozen.pt", "BN202", "bn"),
        ("frozen.safetensors", "BN202", "bn"),
        ("reset.pt", "BN201", "bn"),
    ]
    first = records[0]
    assert first["location"] == {"row": 1, "column": 1} and first["fix"] is None
    assert first["url"].endswith(f"{first['code']}.toml")


def test_cli_full_table_concise_and_exit_codes(artifacts):
    full = run_bnfix("inspect", str(artifacts / "frozen.pt"), str(artifacts / "healthy.pth"))
    assert full.returncode == 1
    lines = full.stdout.splitlines()
    assert lines[0].startswith(f"{artifacts / 'frozen.pt'}  (torch-state-dict; 1 BN layer; "
                               "trained: num_batches_tracked = 3;")
    assert lines[1].split() == ["layer", "ch", "gamma", "beta", "mean", "var", "flags"]
    assert lines[2].split()[:6] == ["bn", "4", "all", "1", "all", "0"]
    assert lines[2].split()[-1] == "BN202"
    assert f"{artifacts / 'frozen.pt'}:1:1: BN202 bn: gamma all 1" in full.stdout
    assert full.stdout.endswith("Found 1 error.\n")

    concise = run_bnfix("inspect", str(artifacts / "frozen.pt"), "--output-format", "concise",
                        "--exit-zero")
    assert concise.returncode == 0
    assert concise.stdout.splitlines()[0].startswith(f"{artifacts / 'frozen.pt'}:1:1: BN202 bn:")

    clean = run_bnfix("inspect", str(artifacts / "healthy.pth"), str(artifacts / "untrained.pt"))
    assert clean.returncode == 0 and clean.stdout.endswith("All checks passed!\n")

    usage = run_bnfix("inspect", str(artifacts / "frozen.pt"), "--select", "BN299")
    assert usage.returncode == 2 and "unknown rule selector `BN299`" in usage.stderr


@pytest.mark.slow
def test_cli_github_sarif_and_plot(artifacts, tmp_path):
    png = tmp_path / "bn.png"
    gh = run_bnfix("inspect", str(artifacts / "frozen.pt"), str(artifacts / "reset.pt"),
                   str(artifacts / "healthy.pth"), "--output-format", "github", "--plot", str(png))
    assert gh.returncode == 1
    assert gh.stdout.count("::error title=bnfix (") == 2
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert f"wrote {png} (3 artifacts)" in gh.stderr
    sarif = run_bnfix("inspect", str(artifacts / "reset.pt"), "--output-format", "sarif")
    results = json.loads(sarif.stdout)["runs"][0]["results"]
    assert [r["ruleId"] for r in results] == ["BN201"]


# -- the project's configuration and rule selection -------------------------------------------


def test_select_of_a_source_rule_is_a_usage_error(artifacts):
    run = run_bnfix("inspect", "--select", "BN001", str(artifacts / "frozen.pt"))
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.splitlines() == [(
        "bnfix: --select BN001: BN001 is a source rule (run by `bnfix check`); inspect runs the "
        "artifact rules BN201, BN202, BN203, BN204, BN205, BN206, BN207, BN208, BN902")]


def test_project_configuration_applies(artifacts, tmp_path):
    """[tool.bnfix] of the project: ignore, per-file-ignores and extend-exclude as `check` reads
    them; a `select` naming only source rules leaves the artifact rules on."""
    project = tmp_path / "project"
    (project / "old").mkdir(parents=True)
    (project / "excluded").mkdir()
    for where in ("frozen.pt", "old/frozen.pt", "excluded/frozen.pt", "eval.ckpt"):
        source = "eval_mode.ckpt" if where == "eval.ckpt" else "frozen.pt"
        (project / where).write_bytes((artifacts / source).read_bytes())
    (project / "pyproject.toml").write_text(
        '[tool.bnfix]\nselect = ["BN0"]\nignore = ["BN207"]\nextend-exclude = ["excluded"]\n'
        '[tool.bnfix.per-file-ignores]\n"old/*" = ["BN202"]\n"*.ckpt" = ["BN201"]\n')
    run = run_bnfix("inspect", "--output-format", "json", ".", cwd=project)
    assert run.returncode == 1, run.stderr
    found = sorted((Path(record["filename"]).relative_to(project).as_posix(), record["code"])
                   for record in json.loads(run.stdout))
    assert found == [("frozen.pt", "BN202")], found
    (project / "pyproject.toml").write_text('[tool.bnfix]\nper-file-ignores = {"x" = ["BN9999"]}\n')
    bad = run_bnfix("inspect", ".", cwd=project)
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1, bad.stderr
    assert "BN9999" in bad.stderr
