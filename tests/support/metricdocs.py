"""The README's metrics table, read as data: which metrics exist, their labels and the values a label may take.

Tests compare it with the metrics the code defines and with what a running platform exposes, so the docs
and the exposition cannot drift apart (a label value the code adds, e.g. a new ``trigger``, fails them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
TABLE_HEAD = "| metric | type | labels | what |"
# `label` optionally followed by its values: (`a`, `b`; prose after a semicolon is ignored)
LABEL = re.compile(r"`([a-z_]+)`(?:\s*\(([^)]*)\))?")
# the series a family's samples carry beside its own name (histograms: le on the buckets)
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",),
            "histogram": ("_bucket", "_sum", "_count", "_created")}


@dataclass(frozen=True)
class DocumentedMetric:
    name: str  # as documented: a counter's with its _total
    kind: str  # counter, gauge or histogram
    labels: dict[str, frozenset[str] | None]  # None: any value (names, statuses)

    @property
    def family(self) -> str:
        """The family name prometheus_client gives it (a counter's without _total)."""
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name

    def series_names(self) -> set[str]:
        return {self.family + suffix for suffix in SUFFIXES[self.kind]}


def documented_metrics(readme: Path = README) -> dict[str, DocumentedMetric]:
    """Every row of the metrics table, by metric name."""
    lines = readme.read_text().splitlines()
    start = lines.index(TABLE_HEAD) + 2
    found: dict[str, DocumentedMetric] = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        name_cell, kind, labels_cell = (cell.strip() for cell in line.strip("|").split("|")[:3])
        name = name_cell.strip("`")
        assert re.fullmatch(r"sless_[a-z_]+", name), f"one metric per row: {name_cell!r}"
        labels: dict[str, frozenset[str] | None] = {}
        for label, values in LABEL.findall(labels_cell):
            listed = values.split(";", 1)[0]
            labels[label] = frozenset(re.findall(r"`([^`]+)`", listed)) if values else None
        found[name] = DocumentedMetric(name, kind, labels)
    return found


def undocumented_series(exposition: str, docs: dict[str, DocumentedMetric] | None = None) -> list[str]:
    """What EXPOSITION (a scrape's text) has that the table does not say: a sless_ series of no documented
    metric, a label not in its row, a value outside the row's listed values. Empty when they agree."""
    from prometheus_client.parser import text_string_to_metric_families

    docs = documented_metrics() if docs is None else docs
    by_series = {series: metric for metric in docs.values() for series in metric.series_names()}
    problems: list[str] = []
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if not sample.name.startswith("sless_"):
                continue  # the client library's own process and GC metrics
            metric = by_series.get(sample.name)
            if metric is None:
                problems.append(f"{sample.name}: not in the README's metrics table")
                continue
            for label, value in sample.labels.items():
                if label == "le" and sample.name.endswith("_bucket"):
                    continue
                if label not in metric.labels:
                    problems.append(f"{sample.name}: label {label!r} not documented")
                elif (allowed := metric.labels[label]) is not None and value not in allowed:
                    problems.append(f"{sample.name}: {label}={value!r} not among the documented {sorted(allowed)}")
    return problems
