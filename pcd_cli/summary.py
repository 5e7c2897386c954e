"""Run statistics and the end-of-run summary (rich tables).

Per field: label distribution, mean probability of the chosen label, mean candidate mass,
count of records with mass below ``min_mass``, and the worst low-mass (record, field) pairs.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .decode import RecordResult
from .schema import Schema


@dataclass
class FieldStats:
    labels: Counter = field(default_factory=Counter)
    prob_sum: float = 0.0
    mass_sum: float = 0.0
    low_mass: int = 0


@dataclass
class RunStats:
    """Accumulates results as they stream by.

    Attributes:
        min_mass: records whose candidate mass is below this count as low-mass.
        worst_n: how many of the lowest-mass (record, field) pairs to keep.
    """

    schema: Schema
    min_mass: float = 0.5
    worst_n: int = 10
    records: int = 0
    failures: int = 0
    forward_passes: int = 0
    seconds: float = 0.0
    fields: list[FieldStats] = field(default_factory=list)
    _worst: list = field(default_factory=list)  # max-heap on -mass of (neg mass, n, record, field)

    def __post_init__(self) -> None:
        self.fields = [FieldStats() for _ in self.schema.fields]

    def add(self, result: RecordResult) -> None:
        self.records += 1
        for i, (f, res) in enumerate(zip(self.schema.fields, result.fields)):
            st = self.fields[i]
            st.labels[f.labels[res.label]] += 1
            st.prob_sum += res.prob
            st.mass_sum += res.mass
            if res.mass < self.min_mass:
                st.low_mass += 1
                item = (-res.mass, self.records, str(result.id), f.name)
                if len(self._worst) < self.worst_n:
                    heapq.heappush(self._worst, item)
                else:
                    heapq.heappushpop(self._worst, item)

    @property
    def records_per_second(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def passes_per_record(self) -> float:
        return self.forward_passes / self.records if self.records else 0.0

    def worst(self) -> list[tuple[float, str, str]]:
        """Lowest-mass (mass, record id, field) pairs, lowest first."""
        return [(-neg, rid, name) for neg, _, rid, name in sorted(self._worst, reverse=True)]

    def render(self, console: Console) -> None:
        """Print the summary: totals, one row per field, the worst low-mass pairs."""
        n = max(self.records, 1)
        console.print(f"[bold]{self.records}[/] records labelled, {self.failures} failed, "
                      f"{len(self.schema.fields)} fields, {self.records_per_second:.2f} records/s, "
                      f"{self.passes_per_record:.2f} forward passes per record")
        table = Table(title=f"schema {escape(self.schema.name)}", show_lines=False)
        table.add_column("field")
        table.add_column("labels (count)")
        table.add_column("mean prob", justify="right")
        table.add_column("mean mass", justify="right")
        table.add_column(f"mass < {self.min_mass:g}", justify="right")
        for f, st in zip(self.schema.fields, self.fields):
            dist = ", ".join(f"{escape(label)} {count}" for label, count in st.labels.most_common(4))
            if len(st.labels) > 4:
                dist += f", +{len(st.labels) - 4} more"
            table.add_row(escape(f.name), dist, f"{st.prob_sum / n:.3f}", f"{st.mass_sum / n:.3f}",
                          f"[red]{st.low_mass}[/]" if st.low_mass else "0")
        console.print(table)
        worst = self.worst()
        if worst:
            low = Table(title="lowest candidate mass (the model wanted to answer off the menu)")
            low.add_column("record")
            low.add_column("field")
            low.add_column("mass", justify="right")
            for mass, rid, name in worst:
                low.add_row(escape(rid), escape(name), f"{mass:.3g}")
            console.print(low)
