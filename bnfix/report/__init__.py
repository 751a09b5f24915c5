"""Output formats for diagnostics (full, concise, json, github, sarif), statistics and the
run summary."""

from bnfix.report.formats import FORMATS, render, statistics, summary

__all__ = ["FORMATS", "render", "statistics", "summary"]
