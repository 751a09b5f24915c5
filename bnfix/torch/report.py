"""What a conversion did: one record per BN module converted or refused."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ConversionRecord:
    """One module: where it sits (dotted path, "" for the root), its class before and after
    (`to_class` is "" when refused), why (refusal reason, or a note on how it was converted) and
    which conversion made the record (`action`: "convert_sync", "fold", ...)."""

    path: str
    from_class: str
    to_class: str
    reason: str = ""
    action: str = ""

    @property
    def where(self) -> str:
        return self.path or "(root)"


@dataclass
class ConversionReport:
    """Records of one or more conversions; pass the same report to several calls to collect all.

    `str(report)` is a plain-text table (status, path, from, to, note) for a terminal or a CLI.
    """

    converted: list[ConversionRecord] = field(default_factory=list)
    refused: list[ConversionRecord] = field(default_factory=list)

    def extend(self, other: ConversionReport) -> None:
        self.converted.extend(other.converted)
        self.refused.extend(other.refused)

    def __str__(self) -> str:
        rows = [("action", "status", "module", "from", "to", "note")]
        rows += [(r.action, "converted", r.where, r.from_class, r.to_class, r.reason)
                 for r in self.converted]
        rows += [(r.action, "refused", r.where, r.from_class, "-", r.reason) for r in self.refused]
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[5]
                 for row in rows]
        lines.append(f"{len(self.converted)} converted, {len(self.refused)} refused")
        return "\n".join(line.rstrip() for line in lines)


class ConversionRefused(Exception):
    """Raised by a conversion called with `strict=True` when any module would be refused; the
    model is left untouched. `records` lists the refusals."""

    def __init__(self, action: str, records: list[ConversionRecord]) -> None:
        self.records = records
        lines = [f"{action}: {len(records)} module(s) refused, nothing converted:"]
        lines += [f"  {r.where} ({r.from_class}): {r.reason}" for r in records]
        super().__init__("\n".join(lines))
