"""Keep TensorFlow's and absl's log lines out of bnfix's output.

TensorFlow 2.21 writes C++ log lines straight to file descriptor 2 (`WARNING: All log messages
before absl::InitializeLog() ...`, `oneDNN custom operations are on ...`, `This TensorFlow
binary is optimized ...`), some of them whatever TF_CPP_MIN_LOG_LEVEL says, and Python-side
warnings through absl logging. `inspect` and `convert` print findings and one-line errors that
scripts parse: while a framework is imported or an artifact is read, descriptor 2 is sent to a
temporary file, which is replayed only when what ran inside fails unexpectedly (its output then
belongs to the error reported after it).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

REPLAYED = 8000  # bytes of the captured output shown before an unexpected error


@contextmanager
def silenced_stderr(expected: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Descriptor 2 (C++ logs, and Python's sys.stderr) goes to a temporary file inside; an
    exception that is not `expected` gets the captured tail replayed before it propagates."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        except expected:
            raise
        except BaseException:
            sys.stderr.flush()
            os.dup2(saved, 2)
            sink.seek(0)
            os.write(2, sink.read()[-REPLAYED:])
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            _quiet_python_loggers()


def _quiet_python_loggers() -> None:
    """absl's and TensorFlow's Python loggers: errors only."""
    for name in ("absl", "tensorflow", "h5py"):
        if name in sys.modules or name == "absl":
            logging.getLogger(name).setLevel(logging.ERROR)
    absl = sys.modules.get("absl.logging")
    if absl is not None:
        absl.set_verbosity(absl.ERROR)
