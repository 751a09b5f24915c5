"""What a Keras conversion did, layer by layer: the record `convert_sync` / `revert_sync` fill
when given `report=`, and the CLI prints."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class LayerChange:
    """One BN layer whose `synchronized` flag was changed."""

    path: str  # names from the top model down, "/"-joined; a shared layer lists its first path
    layer_class: str
    before: bool
    after: bool
    via: str  # "config": rebuilt from its config (saved with the model); "attribute": set in place
    aliases: tuple[str, ...] = ()  # the other paths of a layer used in several places


@dataclass(frozen=True)
class Refusal:
    path: str
    reason: str


@dataclass
class ConversionReport:
    """Pass one to `convert_sync(model, report=...)`; a report given to several calls collects
    all of their records (`synchronized` and `in_place` describe the last call)."""

    synchronized: bool | None = None  # the target value of `synchronized` (None: not run yet)
    in_place: bool = False  # True: the model itself was changed (subclassed models); else a clone
    converted: list[LayerChange] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)  # BN layers already at the target
    refused: list[Refusal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def bn_layers(self) -> int:
        return len(self.converted) + len(self.unchanged) + len(self.refused)

    @property
    def refused_everything(self) -> bool:
        """BN layers were found and every one that needed converting was refused."""
        return bool(self.refused) and not self.converted

    def table(self) -> str:
        """One line per layer, then the totals."""
        lines = []
        width = max((len(c.path) for c in self.converted), default=0)
        for change in self.converted:
            also = f"  (also {', '.join(change.aliases)})" if change.aliases else ""
            lines.append(f"  {change.path:<{width}}  {change.layer_class}  synchronized "
                         f"{change.before} -> {change.after}  [{change.via}]{also}")
        for refusal in self.refused:
            lines.append(f"  {refusal.path}  refused: {refusal.reason}")
        target = f"synchronized={self.synchronized}"
        where = "in place" if self.in_place else "in a copy of the model"
        total = (f"{len(self.converted)} of {self.bn_layers} BatchNormalization layers set to "
                 f"{target} {where}")
        if self.unchanged:
            total += f"; {len(self.unchanged)} already were"
        if self.refused:
            total += f"; {len(self.refused)} refused"
        if self.refused_everything:
            total += " (nothing converted)"
        return "\n".join([*lines, total + ".", *self.notes])

    __str__ = table
