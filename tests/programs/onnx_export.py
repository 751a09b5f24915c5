"""Export the torch models the ONNX tests convert (legacy TorchScript exporter, no network).

    python onnx_export.py OUT_DIR

- train_mode.onnx: Conv -> BN -> ReLU exported in training mode: BatchNormalization with
  training_mode=1 and three outputs (what `convert --to inference` fixes), and
  train_mode_reference.onnx: the same module exported in eval mode, the independent reference;
- dropout_train.onnx / dropout_reference.onnx: Conv -> BN -> ReLU -> Dropout -> Linear in
  training mode (Dropout with training_mode true: random on every run) and in eval mode;
- grouped_conv.onnx, conv_transpose.onnx, linear.onnx: eval-mode Conv(groups=2)+BN,
  ConvTranspose(groups=2)+BN, Linear+BN1d, exported with BN kept (TrainingMode.PRESERVE,
  no constant folding: the exporter's own folding would remove the BN nodes under test).
BN statistics are set to non-trivial values so that a wrong fold shows.
"""

import sys
import warnings
from pathlib import Path

import torch
from torch import nn

warnings.filterwarnings("ignore")


def randomize_bn(model: nn.Module) -> nn.Module:
    gen = torch.Generator().manual_seed(1)
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            c = module.num_features
            with torch.no_grad():
                module.weight.copy_(torch.rand(c, generator=gen) + 0.5)
                module.bias.copy_(torch.randn(c, generator=gen))
                module.running_mean.copy_(torch.randn(c, generator=gen))
                module.running_var.copy_(torch.rand(c, generator=gen) * 2 + 0.1)
    return model


def export(model: nn.Module, example: torch.Tensor, path: Path, mode) -> None:
    torch.onnx.export(model, (example,), str(path), dynamo=False, training=mode,
                      do_constant_folding=False, input_names=["x"], output_names=["y"])


def main(out: Path) -> None:
    torch.manual_seed(0)
    train = randomize_bn(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4),
                                       nn.ReLU()))
    export(train.train(), torch.randn(2, 3, 8, 8), out / "train_mode.onnx",
           torch.onnx.TrainingMode.TRAINING)
    export(train.eval(), torch.randn(2, 3, 8, 8), out / "train_mode_reference.onnx",
           torch.onnx.TrainingMode.EVAL)
    dropout = randomize_bn(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
                                         nn.Flatten(), nn.Dropout(0.5), nn.Linear(144, 3)))
    export(dropout.train(), torch.randn(2, 3, 8, 8), out / "dropout_train.onnx",
           torch.onnx.TrainingMode.TRAINING)
    export(dropout.eval(), torch.randn(2, 3, 8, 8), out / "dropout_reference.onnx",
           torch.onnx.TrainingMode.EVAL)
    preserve = torch.onnx.TrainingMode.PRESERVE
    models = {
        "grouped_conv.onnx": (nn.Sequential(nn.Conv2d(4, 6, 3, padding=1, groups=2),
                                            nn.BatchNorm2d(6)), torch.randn(2, 4, 8, 8)),
        "conv_transpose.onnx": (nn.Sequential(nn.ConvTranspose2d(4, 6, 3, stride=2, groups=2,
                                                                 bias=False),
                                              nn.BatchNorm2d(6)), torch.randn(2, 4, 5, 5)),
        "linear.onnx": (nn.Sequential(nn.Linear(5, 3), nn.BatchNorm1d(3)), torch.randn(4, 5)),
    }
    for name, (model, example) in models.items():
        export(randomize_bn(model).eval(), example, out / name, preserve)
    print("exported", ", ".join(["train_mode.onnx", *models]))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
