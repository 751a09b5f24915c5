"""Warm runs equal cold runs on real trees: each tree is copied, checked once with the cache,
then its model file (the one `bench/run.py` edits) gets a TF1 BN wrapper and a torch BN class
(conv with bias + BN); another file gets a function that loads trained weights (a mark every
file's check reads: it turns the class's BN104 fix display-only) and is restored;
the model file gets a plain function and one that calls its first BN-building function (a
function added that nothing else names: the other files keep their contexts unread), then
that BN-building function is hidden behind a `*args` wrapper of the same name (what every
caller's check reads of it changes: their cached findings must not stand), and it is
restored. After each edit the cached (incremental) run's findings, fixes included, must
equal a `--no-cache` run's.

    python bench/warm_cold.py ~/corpus/timm ~/corpus/tpu ...

Prints one row per edit; exit 1 when a warm run differs."""

from __future__ import annotations

import ast
import json
import re
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
    ("torch class", "\n\nimport torch.nn as _bench_nn\n\n\nclass _BenchNet(_bench_nn.Module):\n"
                    "    def __init__(self):\n        super().__init__()\n"
                    "        self.conv = _bench_nn.Conv2d(3, 3, 3, bias=True)\n"
                    "        self.bn = _bench_nn.BatchNorm2d(3, momentum=0.9)\n\n"
                    "    def forward(self, x):\n        return self.bn(self.conv(x))\n"),
    ("plain function", "\n\ndef _bench_plain():\n    pass\n"),
)


LOADS = ("\n\ndef _bench_load(model):\n    import torch\n"
         "    model.load_state_dict(torch.load('weights.pt'))\n")


def findings(root: Path, cache: bool) -> list[tuple[str, str, int, str]]:
    argv = [sys.executable, "-m", "bnfix", "check", ".", "--select", "ALL",
            "--output-format", "json", "--exit-zero", *([] if cache else ["--no-cache"])]
    out = subprocess.run(argv, cwd=root, capture_output=True, text=True, check=True).stdout
    return sorted((d["filename"], d["code"], d["location"]["row"], d["message"],
                   json.dumps(d["fix"], sort_keys=True)) for d in json.loads(out))


def builder(text: str) -> str | None:
    """The first top-level function of the model file that builds BN (others call it)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any(
                w in (ast.get_source_segment(text, node) or "")
                for w in ("BatchNorm", "batch_norm", "batch_normalization")):
            return node.name
    return None


def wrapped(text: str, name: str) -> str:
    """`text` with function `name` renamed and a wrapper of that name that hides its args."""
    return re.sub(rf"^def {name}\(", f"def _bench_orig_{name}(", text, count=1,
                  flags=re.MULTILINE) + (f"\n\ndef {name}(*args, **kwargs):\n"
                                         f"    return _bench_orig_{name}(*args, **kwargs)\n")


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
            # another file (a new one would change the project's file set, which re-checks
            # everything anyway), which gets a function that loads trained weights
            elsewhere = next(p for p in sorted(root.rglob("*.py"), reverse=True)
                             if p != target and p.name != "__init__.py")
            before = elsewhere.read_text()
            steps = [(label, lambda text=text: target.write_text(target.read_text() + text))
                     for label, text in EDITS]
            # with the torch class's conv + BN (BN104) in: its fix depends on the new file
            steps[2:2] = [("loads elsewhere", lambda: elsewhere.write_text(before + LOADS)),
                          ("removed", lambda: elsewhere.write_text(before))]
            name = builder(original)
            if name is not None:
                calls = f"\n\ndef _bench_calls(*args):\n    return {name}(*args)\n"
                steps.append(("calls builder", lambda calls=calls: target.write_text(
                    target.read_text() + calls)))
                text = wrapped(original, name)
                steps.append(("wrapped builder", lambda text=text: target.write_text(text)))
            steps.append(("restored", lambda: target.write_text(original)))
            for label, edit in steps:
                edit()
                warm, cold = findings(root, True), findings(root, False)
                failed |= warm != cold
                print(f"{root.name:20} {target.relative_to(root)}  {label:15} warm {len(warm):3} "
                      f"cold {len(cold):3}  {'equal' if warm == cold else 'DIFFER'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
