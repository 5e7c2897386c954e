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

from ..io.output import chosen_options, option_decisions
from ..io.values import RepeatedIds
from ..quality.metrics import one_label
from ..results import RecordResult
from ..schema.model import CHANGED_SUFFIX, STEERED_SUFFIX, TRUNCATED_COLUMN, Schema
from ..schema.rules import rule_fields


@dataclass
class FieldStats:
    labels: Counter = field(default_factory=Counter)
    prob_sum: float = 0.0
    mass_sum: float = 0.0
    low_mass: int = 0


#: How a field left without a label (``abstain_below``, ``--abstain-unless-single``) is counted.
ABSTAINED = "(abstained)"


@dataclass(frozen=True)
class Resumed:
    """The earlier runs a resumed run continued, as their committed work says
    (``pcd_cli.engines.checkpoint.Progress``): ``rows`` done, ``model_rows`` decoded by the model,
    ``forward_passes``, wall ``seconds`` (summed over those runs, to their last commit)."""

    rows: int
    model_rows: int
    forward_passes: int
    seconds: float


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
    #: rows whose unchanged fields were copied from an earlier output, the others decoded
    #: (``--reuse`` with ``isolate_fields``: a ``pcd_cli.engines.reuse.Lender`` that decodes some fields)
    partly_reused: int = 0
    forward_passes: int = 0
    seconds: float = 0.0
    #: records this process decoded with the model (``add``; a partly reused row too), copies not counted
    model_rows: int = 0
    #: a resumed run: what the earlier runs did (``Resumed``); ``forward_passes``, ``seconds`` and
    #: ``model_rows`` above are this process's, ``whole_cost`` the sum
    resumed: Resumed | None = None
    fields: list[FieldStats] = field(default_factory=list)
    #: rows whose id repeats an earlier row's (counted by the caller; never merged)
    repeated_ids: RepeatedIds = field(default_factory=RepeatedIds)
    #: rows whose bytes that are not UTF-8 were read as U+FFFD (``--encoding-errors replace``:
    #: the reader's ``pcd_cli.io.readers.ReplacedRows``; ``None`` without the option)
    replaced: object | None = None
    #: per field a rule names: rows whose label the rules moved (``<f>__changed_by_rules``)
    rule_changes: Counter = field(default_factory=Counter)
    #: rows with a field the steering check moved (``<f>__steered``, ``pcd_cli.steering``)
    steered: int = 0
    _worst: list = field(default_factory=list)  # max-heap on -mass of (neg mass, n, record, field)

    def __post_init__(self) -> None:
        self.fields = [FieldStats() for _ in self.schema.fields]
        # per decision: how a copied row's cells name it (``_copied``), read once here
        self._reads = []
        for f in self.schema.fields:
            if f.group is not None:  # an option of a multi field: the field's columns
                self._reads.append((None, f.group, f"{f.group}__probs", f"{f.group}__mass", f.option, f.labels))
            else:
                self._reads.append(({f.value(i): label for i, label in enumerate(f.labels)}, f.name,
                                    f"{f.name}__prob", f"{f.name}__mass", None, f.labels))
        self._multi = [(f, part) for f, part in self.schema.declared_parts() if f.is_multi]
        self._rules = [(name, f"{name}{CHANGED_SUFFIX}") for name in rule_fields(self.schema)]

    def add(self, result: RecordResult) -> None:
        """Count one record this process decoded, exactly, from its ``RecordResult``: each
        field's label (``(abstained)`` when its value is ``None``), probability and candidate
        mass. An option of a multi field counts as the output writes it: ``true`` when it is among
        the chosen options (``pcd_cli.io.output.chosen_options``, the written list), with the
        probability of that answer and the option's own mass."""
        self.truncated += result.truncated
        self.decoded += 1
        self.model_rows += 1
        fields = result.fields
        counted = [(ABSTAINED if res.value is None else f.labels[res.label], res.prob, res.mass)
                   for f, res in zip(self.schema.fields, fields)]
        for multi, part in self._multi:
            options = [fields[i] for i in part]
            chosen = chosen_options(multi, [res.probs[0] for res in options], option_decisions(options))
            for k, (i, res) in enumerate(zip(part, options)):
                answer = 0 if k in chosen else 1  # label 0 is true
                counted[i] = (self.schema.fields[i].labels[answer], res.probs[answer], res.mass)
        self._add(result.id, counted)
        self.rule_changes.update(f.name for f, res in zip(self.schema.fields, fields) if res.changed_by_rules)
        self.steered += any(res.steered for res in fields)

    def add_rows(self, rows: list[dict], id_column: str) -> None:
        """Count rows this process labelled by copying them (``--reuse``'s reused rows, the
        deduplicated repeats of a text: ``pcd_cli.engines.reuse.ReusingLabeler``), each a dict
        of the output columns whose id is ``row[id_column]``. Decoded rows are counted from their
        ``RecordResult`` (``add``).

        A row holds no mass of a multi field's single option, only the field's ``<f>__mass`` (the
        smallest of its options'), so each option of a copied row counts that mass; its label and
        probability are exact (``true`` when the written list holds it, P(yes) from
        ``<f>__probs``)."""
        self._copied(rows, id_column)
        self.truncated += sum(bool(row.get(TRUNCATED_COLUMN)) for row in rows)
        self.decoded += len(rows)

    def add_table(self, table) -> None:
        """Count the labelled rows of an output table (a resumed run's earlier batches, a Ray
        run's labelled blocks), its first column the id, as copied rows are counted (``add_rows``:
        a multi field's options count the field's mass).

        ``truncated`` and ``failures`` are not taken from it; the caller restores them.
        """
        id_column = table.column_names[0]
        counted = dict.fromkeys(name for read in self._reads for name in read[1:4])  # value, prob, mass
        rules = [c for _, c in self._rules if c in table.column_names]
        steered = [c for c in (f"{f.name}{STEERED_SUFFIX}" for f in self.schema.declared) if c in table.column_names]
        self._copied(table.select([id_column, *counted, *rules, *steered]).to_pylist(), id_column)

    def _copied(self, rows: list[dict], id_column: str) -> None:
        """Count rows given as dicts of output columns (``add_rows``, ``add_table``)."""
        for row in rows:
            counted, groups = [], {}
            for names, column, prob, mass, option, labels in self._reads:
                if option is None:
                    value = row[column]
                    counted.append((ABSTAINED if value is None else names[value], row[prob], row[mass]))
                    continue
                written = groups.get(column)
                if written is None:
                    chosen = row[column]
                    written = groups[column] = (None if chosen is None else set(chosen), dict(row[prob] or ()),
                                                row[mass])
                chosen, p_yes, field_mass = written
                p = float(p_yes.get(option, 0.0))
                if chosen is None:
                    counted.append((ABSTAINED, p, field_mass))
                elif option in chosen:
                    counted.append((labels[0], p, field_mass))
                else:
                    counted.append((labels[1], 1.0 - p, field_mass))
            self._add(row[id_column], counted)
            for name, column in self._rules:
                if row.get(column):
                    self.rule_changes[name] += 1
            self.steered += any(bool(row.get(f"{f.name}{STEERED_SUFFIX}")) for f in self.schema.declared)

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

    def metadata(self, input_meta: dict[str, str]) -> dict[str, str]:
        """The run's part of the output's key-value metadata: what it read (``input_meta``:
        ``pcd_cli.engines.local.input_metadata``) and the counts ``pcd.records_read|labelled|
        failed|truncated|reused|deduplicated|partly_reused``."""
        return input_meta | {"pcd.records_read": str(self.read),
                "pcd.records_labelled": str(self.records), "pcd.records_failed": str(self.failures),
                "pcd.records_truncated": str(self.truncated), "pcd.records_reused": str(self.reused),
                "pcd.records_deduplicated": str(self.deduplicated),
                "pcd.records_partly_reused": str(self.partly_reused)}

    @property
    def records_per_second(self) -> float:
        return self.decoded / self.seconds if self.seconds > 0 else 0.0

    @property
    def passes_per_record(self) -> float:
        return self.forward_passes / self.decoded if self.decoded else 0.0

    def worst(self) -> list[tuple[float, str, str]]:
        """Lowest-mass (mass, record id, field) pairs, lowest first."""
        return [(-neg, rid, name) for neg, _, rid, name in sorted(self._worst, reverse=True)]

    def whole_cost(self) -> tuple[int, int, float]:
        """``(model_rows, forward_passes, seconds)`` of the whole run: this process's plus, when it
        resumed, the earlier runs' (``resumed``)."""
        before = self.resumed or Resumed(0, 0, 0, 0.0)
        return (before.model_rows + self.model_rows, before.forward_passes + self.forward_passes,
                before.seconds + self.seconds)

    def resumed_line(self) -> str | None:
        """One plain sentence for a resumed run's summary: what the earlier runs did and what the
        whole run cost; ``None`` for a run that did not resume."""
        if self.resumed is None:
            return None
        r, (rows, passes, seconds) = self.resumed, self.whole_cost()
        return (f"resumed: {r.rows} rows were done by an earlier run ({r.model_rows} decoded, {r.forward_passes} "
                f"forward passes, {r.seconds:.1f} s); this run decoded {self.model_rows} ({self.forward_passes} "
                f"passes, {self.seconds:.1f} s); the whole run: {rows} decoded, {passes} forward passes, {seconds:.1f} s")

    def to_dict(self) -> dict:
        """The summary as plain JSON-able data (for ``--log-format json``): this process's rates
        (``seconds``, ``records_per_second``, ``forward_passes_per_record``), ``decoded`` (rows
        through the model), and for a resumed run ``resumed`` (the earlier runs') and
        ``whole_run`` (the sum: rows decoded, forward passes, seconds)."""
        n = max(self.records, 1)
        rows, passes, seconds = self.whole_cost()
        resumed = {"resumed": {"rows": self.resumed.rows, "decoded": self.resumed.model_rows,
                               "forward_passes": self.resumed.forward_passes,
                               "seconds": round(self.resumed.seconds, 3)},
                   "whole_run": {"decoded": rows, "forward_passes": passes, "seconds": round(seconds, 3)}} \
            if self.resumed is not None else {}
        return resumed | {"decoded": self.model_rows, 
            "read": self.read, "labelled": self.records, "failed": self.failures, "truncated": self.truncated,
            "reused": self.reused, "deduplicated": self.deduplicated, "partly_reused": self.partly_reused,
            "steered": self.steered, "seconds": round(self.seconds, 3), "records_per_second": round(self.records_per_second, 3),
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
                      f"{self.truncated} truncated, {self.reused} reused, {self.deduplicated} deduplicated"
                      f"{f', {self.partly_reused} partly reused' if self.partly_reused else ''}"
                      f"{f', {self.steered} steered (see <field>__steered)' if self.steered else ''}; "
                      f"{len(self.schema.fields)} field{'s' * (len(self.schema.fields) != 1)}, "
                      f"{self.records_per_second:.2f} records/s, {self.passes_per_record:.2f} forward passes per record")
        if self.resumed is not None:
            console.print(self.resumed_line(), highlight=False)
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
