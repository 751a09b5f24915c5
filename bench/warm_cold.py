"""Warm runs equal cold runs on real trees: each tree is copied, checked once with the cache,
then its model file (the one `bench/run.py` edits) gets a TF1 BN wrapper, a torch BN class and
a plain function in turn, and is restored; after each edit the cached (incremental) run's
findings must equal a `--no-cache` run's.

    python bench/warm_cold.py ~/corpus/timm ~/corpus/tpu ...

Prints one row per edit; exit 1 when a warm run differs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from run import model_file

EDITS = (
    ("tf1 wrapper", "\n\ndef _bench_wrapper(x, trainable=False):\n"
                    "    import tensorflow.compat.v1 as tf\n"
                    "    return tf.layers.batch_normalization(x, training=True, "
                    "trainable=trainable)\n"),
    ("torch class", "\n\nclass _BenchNet(object):\n    def __init__(self):\n"
                    "        import torch.nn as nn\n        self.bn = nn.BatchNorm2d(3, momentum=0.9)\n"),
    ("plain function", "\n\ndef _bench_plain():\n    pass\n"),
)


def findings(root: Path, cache: bool) -> list[tuple[str, str, int, str]]:
    argv = [sys.executable, "-m", "bnfix", "check", ".", "--select", "ALL",
            "--output-format", "json", "--exit-zero", *([] if cache else ["--no-cache"])]
    out = subprocess.run(argv, cwd=root, capture_output=True, text=True, check=True).stdout
    return sorted((d["filename"], d["code"], d["location"]["row"], d["message"])
                  for d in json.loads(out))


def main() -> int:
    failed = False
    with tempfile.TemporaryDirectory(prefix="bnfix-warm-cold-") as tmp:
        for tree in sys.argv[1:]:
            root = Path(tmp) / Path(tree).name
            shutil.copytree(tree, root, ignore=shutil.ignore_patterns("*.so", "*.pyc"))
            target = model_file([str(root)])
            if target is None:
                print(f"{tree}: no model file")
                continue
            original = target.read_text()
            findings(root, True)
            for label, text in (*EDITS, ("restored", None)):
                target.write_text(original if text is None else target.read_text() + text)
                warm, cold = findings(root, True), findings(root, False)
                failed |= warm != cold
                print(f"{root.name:20} {target.relative_to(root)}  {label:15} warm {len(warm):3} "
                      f"cold {len(cold):3}  {'equal' if warm == cold else 'DIFFER'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
