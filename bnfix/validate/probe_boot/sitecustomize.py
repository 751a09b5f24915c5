"""bnfix's probe, loaded by every Python process `bnfix validate fix` starts (this folder is put
first on PYTHONPATH): it chains to the environment's own sitecustomize, then installs the probe's
import hooks. Nothing in the user's script changes; no framework is imported here."""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _chain() -> None:
    """Run the sitecustomize this one shadows, if any, as `sitecustomize`."""
    others = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _boot() -> None:
    if not os.environ.get("BNFIX_PROBE_DIR"):
        return
    extra = os.environ.get("BNFIX_PROBE_PATH")
    if extra and importlib.util.find_spec("bnfix") is None:
        sys.path.append(extra)
    try:
        from bnfix.validate.probe_runtime import boot
    except ImportError as exc:  # recorded for the report; the user's script still runs
        import json

        path = os.path.join(os.environ["BNFIX_PROBE_DIR"], f"probe-{os.getpid()}.jsonl")
        event = {"kind": "probe_error", "pid": os.getpid(), "rank": None, "where": "boot",
                 "error": f"bnfix is not importable in this interpreter: {exc}"}
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps(event) + "\n")
        return
    boot()


_chain()
_boot()
