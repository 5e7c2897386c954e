"""Run statistics and the end-of-run summary (rich tables).

Per field: label distribution, mean probability of the chosen label, mean candidate mass,
count of records with mass below ``min_mass``, and the worst low-mass (record, field) pairs;
with rules between fields, how many rows the rules moved each field in.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..io.values import RepeatedIds
from ..quality.metrics import one_label
from ..results import RecordResult
from ..schema.model import CHANGED_SUFFIX, TRUNCATED_COLUMN, Schema
from ..schema.rules import rule_fields


@dataclass
class FieldStats:
    labels: Counter = field(default_factory=Counter)
    prob_sum: float = 0.0
    mass_sum: float = 0.0
    low_mass: int = 0


#: How a field left without a label (``abstain_below``, ``--abstain-unless-single``) is counted.
ABSTAINED = "(abstained)"


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
    truncated: int = 0
    decoded: int = 0  #: records labelled by this process (``records`` also counts a resumed run's earlier ones)
    #: rows copied from an earlier output of the same job (``--reuse``), no forward pass
    reused: int = 0
    #: rows that shared the decode of an identical text earlier in this run (``DedupCache``)
    deduplicated: int = 0
    forward_passes: int = 0
    seconds: float = 0.0
    fields: list[FieldStats] = field(default_factory=list)
    #: rows whose id repeats an earlier row's (counted by the caller; never merged)
    repeated_ids: RepeatedIds = field(default_factory=RepeatedIds)
    #: rows whose bytes that are not UTF-8 were read as U+FFFD (``--encoding-errors replace``:
    #: the reader's ``pcd_cli.io.readers.ReplacedRows``; ``None`` without the option)
    replaced: object | None = None
    #: per field a rule names: rows whose label the rules moved (``<f>__changed_by_rules``)
    rule_changes: Counter = field(default_factory=Counter)
    _worst: list = field(default_factory=list)  # max-heap on -mass of (neg mass, n, record, field)

    def __post_init__(self) -> None:
        self.fields = [FieldStats() for _ in self.schema.fields]

    def add(self, result: RecordResult) -> None:
        """Count one labelled record."""
        self.truncated += result.truncated
        self.decoded += 1
        self._add(result.id, [(ABSTAINED if res.value is None else f.labels[res.label], res.prob, res.mass)
                              for f, res in zip(self.schema.fields, result.fields)])
        self.rule_changes.update(f.name for f, res in zip(self.schema.fields, result.fields) if res.changed_by_rules)

    def add_rows(self, rows: list[dict], arrow_schema) -> None:
        """Count labelled rows of this process given as dicts of the output columns
        ``arrow_schema`` (as ``pcd_cli.engines.reuse.ReusingLabeler`` gives them: decoded, reused
        or deduplicated)."""
        if not rows:
            return
        import pyarrow as pa

        self.add_table(pa.Table.from_pylist(rows, schema=arrow_schema))
        self.truncated += sum(bool(row.get(TRUNCATED_COLUMN)) for row in rows)
        self.decoded += len(rows)

    def add_table(self, table) -> None:
        """Count the labelled rows of an output table (a resumed run's earlier batches).

        ``truncated`` and ``failures`` are not taken from it; the caller restores them.
        """
        ids = table.column(0).to_pylist()
        columns = []
        for f in self.schema.fields:
            if f.group is not None:  # an option of a multi field: its column holds the chosen options
                columns.append(_option_column(table, f))
                continue
            names = {f.value(i): label for i, label in enumerate(f.labels)}
            columns.append(([ABSTAINED if v is None else names[v] for v in table.column(f.name).to_pylist()],
                            table.column(f"{f.name}__prob").to_pylist(), table.column(f"{f.name}__mass").to_pylist()))
        for row, rid in enumerate(ids):
            self._add(rid, [(labels[row], probs[row], masses[row]) for labels, probs, masses in columns])
        for name in rule_fields(self.schema):
            if f"{name}{CHANGED_SUFFIX}" in table.column_names:
                self.rule_changes[name] += sum(bool(v) for v in table.column(f"{name}{CHANGED_SUFFIX}").to_pylist())

    def _add(self, record_id: object, fields: list[tuple[str, float, float]]) -> None:
        self.records += 1
        for st, f, (label, prob, mass) in zip(self.fields, self.schema.fields, fields):
            st.labels[label] += 1
            st.prob_sum += prob
            st.mass_sum += mass
            if mass < self.min_mass:
                st.low_mass += 1
                item = (-mass, self.records, str(record_id), f.name)
                if len(self._worst) < self.worst_n:
                    heapq.heappush(self._worst, item)
                else:
                    heapq.heappushpop(self._worst, item)

    @property
    def read(self) -> int:
        """Input rows read: labelled + failed."""
        return self.records + self.failures

    def metadata(self, input_name: str) -> dict[str, str]:
        """The run's part of the output's key-value metadata: ``pcd.input`` (the input file's
        name, or ``<stdin>``) and the counts ``pcd.records_read|labelled|failed|truncated|reused|
        deduplicated``."""
        return {"pcd.input": input_name, "pcd.records_read": str(self.read),
                "pcd.records_labelled": str(self.records), "pcd.records_failed": str(self.failures),
                "pcd.records_truncated": str(self.truncated), "pcd.records_reused": str(self.reused),
                "pcd.records_deduplicated": str(self.deduplicated)}

    @property
    def records_per_second(self) -> float:
        return self.decoded / self.seconds if self.seconds > 0 else 0.0

    @property
    def passes_per_record(self) -> float:
        return self.forward_passes / self.decoded if self.decoded else 0.0

    def worst(self) -> list[tuple[float, str, str]]:
        """Lowest-mass (mass, record id, field) pairs, lowest first."""
        return [(-neg, rid, name) for neg, _, rid, name in sorted(self._worst, reverse=True)]

    def to_dict(self) -> dict:
        """The summary as plain JSON-able data (for ``--log-format json``)."""
        n = max(self.records, 1)
        return {
            "read": self.read, "labelled": self.records, "failed": self.failures, "truncated": self.truncated,
            "reused": self.reused, "deduplicated": self.deduplicated,
            "seconds": round(self.seconds, 3), "records_per_second": round(self.records_per_second, 3),
            "forward_passes_per_record": round(self.passes_per_record, 3),
            "fields": {f.name: {"labels": dict(st.labels.most_common()), "mean_prob": st.prob_sum / n,
                                "mean_mass": st.mass_sum / n, f"mass_below_{self.min_mass:g}": st.low_mass}
                       for f, st in zip(self.schema.fields, self.fields)},
            "lowest_mass": [{"record": rid, "field": name, "mass": mass} for mass, rid, name in self.worst()],
            "repeated_ids": self.repeated_ids.count, "repeated_id_examples": list(self.repeated_ids.examples),
        } | ({"replaced_rows": self.replaced.count, "replaced_row_lines": list(self.replaced.lines)}
             if self.replaced is not None else {}) | ({"changed_by_rules": {name: self.rule_changes[name] for name in rule_fields(self.schema)}}
             if self.schema.rules else {})

    def one_label_warnings(self) -> list[str]:
        """A warning per field where one label took (nearly) every labelled row
        (``quality.metrics.one_label``, the rule ``pcd eval`` warns by), with the rows' mean
        probability of the chosen label."""
        lines = []
        for f, st in zip(self.schema.fields, self.fields):
            found = one_label({k: v for k, v in st.labels.items() if k != ABSTAINED}, len(f.labels))
            if found:
                label, count, n = found
                written = "every row" if count == n else f"{count} of {n} rows"
                lines.append(f"field {f.name!r}: {written} labelled {label!r} (mean probability of the chosen label "
                             f"{st.prob_sum / max(self.records, 1):.3f}): the model may not tell the labels apart on "
                             "these records; score a sample against human labels (pcd eval) before using them")
        return lines

    def render(self, console: Console) -> None:
        """Print the summary: totals, one row per field, the worst low-mass pairs."""
        n = max(self.records, 1)
        console.print(f"{self.read} rows read: [bold]{self.records}[/] records labelled, {self.failures} failed, "
                      f"{self.truncated} truncated, {self.reused} reused, {self.deduplicated} deduplicated; "
                      f"{len(self.schema.fields)} field{'s' * (len(self.schema.fields) != 1)}, "
                      f"{self.records_per_second:.2f} records/s, {self.passes_per_record:.2f} forward passes per record")
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
        if self.schema.rules:
            moved = [(n, c) for n, c in self.rule_changes.most_common() if c]
            console.print("rules between fields moved " + (", ".join(
                f"{escape(name)} in {count} row{'s' * (count != 1)}" for name, count in moved) or "no label"))
        worst = self.worst()
        if worst:
            low = Table(title="lowest candidate mass (the model wanted to answer off the menu)")
            low.add_column("record")
            low.add_column("field")
            low.add_column("mass", justify="right")
            for mass, rid, name in worst:
                low.add_row(escape(rid), escape(name), f"{mass:.3g}")
            console.print(low)


def _option_column(table, f) -> tuple[list[str], list[float], list[float]]:
    """One option decision of a multi field (``f.group``/``f.option``) read back from an output
    table: ``true`` when the written list holds the option, the probability of that answer from
    ``<group>__probs`` (P(yes)), and the multi field's ``<group>__mass`` (the smallest candidate
    mass of its option decisions: the table keeps no option's own mass)."""
    chosen = table.column(f.group).to_pylist()
    p_yes = [dict(m or ()) for m in table.column(f"{f.group}__probs").to_pylist()]
    masses = table.column(f"{f.group}__mass").to_pylist()
    labels, probs = [], []
    for options, p in zip(chosen, p_yes):
        if options is None:
            labels.append(ABSTAINED)
            probs.append(float(p.get(f.option, 0.0)))
            continue
        yes = f.option in options
        labels.append(f.labels[0] if yes else f.labels[1])
        probs.append(float(p.get(f.option, 0.0)) if yes else 1.0 - float(p.get(f.option, 0.0)))
    return labels, probs, masses
