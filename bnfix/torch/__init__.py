"""PyTorch runtime: a synchronized BN for any torch.distributed backend and module converters.

- `SyncBatchNorm`: synced BN on gloo (CPU), NCCL (CUDA) or any backend, with no host sync
  (torch.compile(fullgraph=True) and CUDA graphs capture it); torch's BN outside a process group.
- `convert_sync` / `revert_sync`, `freeze` / `unfreeze`: in-place, reversible conversions of every
  BN in a module tree (exact original classes restored), BN subclasses and norm-act layers
  (timm's BatchNormAct2d) included, decided by catalogue data and a behaviour probe; `fold`: BN
  into the conv/linear that feeds it in the torch.fx graph, for inference. Each takes `strict=`
  and an optional `ConversionReport` to fill. See docs/torch.md.
- `monitor(model, every=10)`: watch every BN while the model trains (`bnfix doctor` from Python);
  `to_group_norm(model, groups=32)`: BN → GroupNorm (a recipe change: retrain).
"""

from bnfix.torch.convert import convert_sync, freeze, revert_sync, unfreeze
from bnfix.torch.distributed import default_backend
from bnfix.torch.fold import fold
from bnfix.torch.frozen import FrozenBatchNorm
from bnfix.torch.functional import SyncBatchNormFunction, sync_batch_norm
from bnfix.torch.groupnorm import to_group_norm
from bnfix.torch.monitor import TorchMonitor, monitor
from bnfix.torch.report import ConversionRecord, ConversionRefused, ConversionReport
from bnfix.torch.sync_bn import SyncBatchNorm

__all__ = [
    "ConversionRecord",
    "ConversionRefused",
    "ConversionReport",
    "FrozenBatchNorm",
    "SyncBatchNorm",
    "SyncBatchNormFunction",
    "TorchMonitor",
    "convert_sync",
    "default_backend",
    "fold",
    "freeze",
    "monitor",
    "revert_sync",
    "sync_batch_norm",
    "to_group_norm",
    "unfreeze",
]
