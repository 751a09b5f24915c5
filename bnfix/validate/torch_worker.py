"""One locally spawned rank of `bnfix validate torch`: `python -m bnfix.validate.torch_worker DIR`.

DIR holds job.json and initial.pt (written by the parent) and the FileStore the ranks meet in;
RANK / WORLD_SIZE / LOCAL_RANK come from the environment, as under torchrun. Rank 0 writes every
rank's records to DIR/ranks.pt. A failing rank writes DIR/rank<R>.error (JSON: when, what) so
the parent reports the first rank that failed, not the peers that lost it.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path


def main(argv: list[str]) -> int:
    workdir = Path(argv[0])
    rank = int(os.environ["RANK"])
    try:
        import torch

        from bnfix.validate.torch_ranks import (
            device_for,
            exact_math,
            gather,
            join,
            leave,
            rank_runs,
            share_initial_state,
        )
        from bnfix.validate.torch_training import TorchJob, build_model

        torch.set_num_threads(1)  # N ranks share the machine's cores
        raw = json.loads((workdir / "job.json").read_text(encoding="utf-8"))
        job = TorchJob(**{**raw, "input_shape": tuple(raw["input_shape"])})
        exact_math()
        device = device_for(job, int(os.environ.get("LOCAL_RANK", rank)))
        join(job, rank, f"file://{workdir / 'store'}")
        model = build_model(job, device)
        share_initial_state(model, torch.load(workdir / "initial.pt", map_location=device,
                                              weights_only=True))
        gathered = gather(rank_runs(job, rank, model, device), rank)
        del model  # freed before the group goes (leave)
        if gathered is not None:
            torch.save(gathered, workdir / "ranks.pt")
        leave()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which ends the others
        from bnfix.validate.errors import ValidateUsageError

        error = {"time": time.time(), "usage": isinstance(exc, ValidateUsageError),
                 "message": f"{type(exc).__name__}: {exc}" if not isinstance(
                     exc, ValidateUsageError) else str(exc)}
        (workdir / f"rank{rank}.error").write_text(json.dumps(error), encoding="utf-8")
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
