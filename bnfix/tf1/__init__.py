"""TF1 runtime: BN statistics synchronized across the towers of one graph.

`sync_towers(n)` wraps a tower loop so that the BN layers the towers build (TF1 layers,
`fused_batch_norm`, `bnfix.tf1.batch_norm`) normalize with the statistics of all towers' batches,
with correct gradients; see `bnfix.tf1.sync` for the mechanism and its limits. Importing this
package imports TensorFlow.
"""

from bnfix.tf1.batch_norm import batch_norm
from bnfix.tf1.sync import sync_towers
from bnfix.tf1.towers import TowerError, TowerSync

__all__ = ["TowerError", "TowerSync", "batch_norm", "sync_towers"]
