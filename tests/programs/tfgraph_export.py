"""Run TF1 programs unchanged and export the graph each one trained as a MetaGraph.

    python tfgraph_export.py SPEC.json

SPEC.json is a list of {"program": path, "args": [...], "meta": out path, "checkpoint": out
prefix}; a job without "meta" only runs its program (a helper that writes its own graphs). The programs run one
after the other in this process (one TensorFlow import for all), each as `__main__` with its own
argv and a fresh default graph. `Session.run` is wrapped only to remember which graph the
program's sessions ran; after the program returns, that graph is written with
`tf.compat.v1.train.export_meta_graph` -- the program itself is not modified, and its graph is
exactly what its sessions executed (whatever train op it built, wired as the program wired it).
With "checkpoint", `Session.close` is wrapped too: the variables are saved (tf.train.Saver, as a
training script saves its checkpoint) just before the program's session closes.
"""

from __future__ import annotations

import json
import os
import runpy
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

_ran: list[tf.Graph] = []
_original_run = tf.compat.v1.Session.run
_original_close = tf.compat.v1.Session.close
_checkpoint: list[str] = []  # the prefix to save the current program's variables to


def _recording_run(self, *args, **kwargs):
    if not _ran or _ran[-1] is not self.graph:
        _ran.append(self.graph)
    return _original_run(self, *args, **kwargs)


def _saving_close(self):
    if _checkpoint and self.graph in _ran and not self._closed:
        with self.graph.as_default():
            tf.compat.v1.train.Saver(tf.compat.v1.global_variables()).save(self, _checkpoint[0])
    return _original_close(self)


def export(program: str, args: list[str], meta: str | None, checkpoint: str | None) -> None:
    tf.compat.v1.reset_default_graph()
    _ran.clear()
    _checkpoint[:] = [checkpoint] if checkpoint else []
    saved_argv = sys.argv
    sys.argv = [program, *args]
    try:
        runpy.run_path(program, run_name="__main__")
    finally:
        sys.argv = saved_argv
    if meta is None:
        return
    if not _ran:
        raise SystemExit(f"{program}: no Session.run call, nothing to export")
    tf.compat.v1.train.export_meta_graph(filename=meta, graph=_ran[-1])
    print(f"exported {program} -> {meta} ({len(_ran[-1].get_operations())} ops)", flush=True)


def main() -> None:
    tf.compat.v1.Session.run = _recording_run
    tf.compat.v1.Session.close = _saving_close
    with open(sys.argv[1], encoding="utf-8") as f:
        for job in json.load(f):
            export(job["program"], job.get("args", []), job.get("meta"), job.get("checkpoint"))


if __name__ == "__main__":
    main()
