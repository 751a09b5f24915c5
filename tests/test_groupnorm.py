"""BN → GroupNorm: `bnfix.torch.to_group_norm` (in place, group counts per layer, refusals),
`bnfix.keras.to_group_norm` (a copy) and `bnfix convert MODEL.keras --to groupnorm`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from conftest import run_bnfix

from bnfix.doctor.remedies import group_count


def test_group_count():
    assert group_count(64, 32) == 32
    assert group_count(48, 32) == 24
    assert group_count(16, 32) == 16
    assert group_count(37, 32) is None and group_count(3, 32) == 3


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
class TestTorch:
    def _model(self):
        import torch
        from torch import nn

        torch.manual_seed(0)
        shared = nn.BatchNorm2d(48)
        return nn.Sequential(nn.Conv2d(3, 48, 3), shared, nn.ReLU(),
                             nn.Sequential(nn.Conv2d(48, 48, 1), shared),
                             nn.Flatten(), nn.LazyLinear(64), nn.BatchNorm1d(64))

    def test_converts_every_bn_with_a_valid_group_count(self):
        import torch
        from torch import nn

        import bnfix.torch

        model = self._model()
        model[1].weight.data.fill_(0.5)
        report = bnfix.torch.ConversionReport()
        same = bnfix.torch.to_group_norm(model, report=report)
        assert same is model
        assert isinstance(model[1], nn.GroupNorm) and model[1] is model[3][1]  # still shared
        assert (model[1].num_groups, model[1].num_channels) == (24, 48)
        assert model[6].num_groups == 32
        assert torch.all(model[1].weight == 0.5)  # γ copied
        assert [(r.path, r.to_class) for r in report.converted] == [("1", "GroupNorm"),
                                                                     ("6", "GroupNorm")]
        assert "recipe change" in report.converted[0].reason
        loss = model(torch.randn(4, 3, 6, 6)).square().mean()
        loss.backward()  # trains
        assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())

    def test_refusals_are_reported_or_raised(self):
        from torch import nn

        import bnfix.torch

        model = nn.Sequential(nn.BatchNorm2d(37), nn.BatchNorm2d(64))
        report = bnfix.torch.ConversionReport()
        bnfix.torch.to_group_norm(model, report=report)
        assert isinstance(model[0], nn.BatchNorm2d) and isinstance(model[1], nn.GroupNorm)
        assert "37 channels have no divisor between 2 and 32" in report.refused[0].reason
        untouched = nn.Sequential(nn.BatchNorm2d(37), nn.BatchNorm2d(64))
        with pytest.raises(bnfix.torch.ConversionRefused, match="37 channels"):
            bnfix.torch.to_group_norm(untouched, strict=True)
        assert isinstance(untouched[1], nn.BatchNorm2d)  # nothing converted
        assert isinstance(bnfix.torch.to_group_norm(nn.BatchNorm2d(8), groups=4), nn.GroupNorm)


keras_only = pytest.mark.skipif(importlib.util.find_spec("keras") is None, reason="needs keras")


@keras_only
@pytest.mark.tf
def test_keras_copy_and_refusal():
    import keras
    import numpy as np

    import bnfix.keras

    inner = keras.Sequential([keras.Input((4, 4, 64)), keras.layers.Conv2D(48, 1),
                              keras.layers.BatchNormalization(name="inner_bn")], name="inner")
    inputs = keras.Input((6, 6, 3))
    x = keras.layers.BatchNormalization(name="bn")(keras.layers.Conv2D(64, 3)(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2)(inner(x)))
    model.get_layer("bn").gamma.assign(np.full(64, 0.5, "float32"))
    copy, report = bnfix.keras.to_group_norm(model)
    assert [(p, c, g) for p, c, g in report.converted] == [("bn", 64, 32),
                                                          ("inner/inner_bn", 48, 24)]
    assert isinstance(copy.get_layer("bn"), keras.layers.GroupNormalization)
    assert np.all(copy.get_layer("bn").gamma.numpy() == 0.5)
    assert isinstance(model.get_layer("bn"), keras.layers.BatchNormalization)  # a copy
    assert copy(np.zeros((2, 6, 6, 3), "float32")).shape == (2, 4, 4, 2)
    odd = keras.Sequential([keras.Input((4, 4, 37)), keras.layers.BatchNormalization()])
    with pytest.raises(bnfix.keras.ConversionRefused, match="37 channels"):
        bnfix.keras.to_group_norm(odd)


@keras_only
@pytest.mark.tf
def test_convert_keras_file_to_groupnorm(tmp_path: Path):
    import keras

    inputs = keras.Input((6, 6, 3))
    x = keras.layers.BatchNormalization()(keras.layers.Conv2D(16, 3)(inputs))
    keras.Model(inputs, keras.layers.Dense(2)(x)).save(tmp_path / "m.keras")
    run = run_bnfix("convert", str(tmp_path / "m.keras"), "--to", "groupnorm", "--groups", "8",
                    "-o", str(tmp_path / "g.keras"), env={"TF_CPP_MIN_LOG_LEVEL": "3"})
    assert run.returncode == 0, run.stderr
    assert "GroupNormalization(groups=8)" in run.stdout and "retrain" in run.stdout
    loaded = keras.saving.load_model(tmp_path / "g.keras")
    assert any(isinstance(layer, keras.layers.GroupNormalization) for layer in loaded.layers)
    wrong = run_bnfix("convert", str(tmp_path / "m.onnx"), "--to", "groupnorm", "-o", "x.onnx")
    assert wrong.returncode == 2 and "does not apply to .onnx" in wrong.stderr
