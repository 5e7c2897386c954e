"""The values every stage passes along: a record in, a record's labels (or its failure) out.

A leaf: the readers (``pcd_cli.io``) make ``Record`` and ``RecordFailure``, the decoder
(``pcd_cli.decoding.decode``) makes ``RecordResult`` and ``FieldResult``, and the engines, output
writers, server and quality tools read them, without importing one another.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

#: The per-row content key column of an output (SHA-256 hex of the record text, ``input_key``),
#: its last column: what ``--reuse`` matches rows by, and what ``pcd calibrate`` groups copies of
#: one text by (``pcd_cli.quality.folds``).
INPUT_KEY_COLUMN = "__input_sha256"


def input_key(text: str) -> str:
    """The content key of a record text (the text the model reads, after ``--template``):
    SHA-256 (hex) of its UTF-8 bytes (surrogates escaped)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Record:
    """One input: its id (as given, or the row number) and the text put in the prompt.

    Attributes:
        row: position among the input's rows, from 0 (``None`` when not read from a file).
        line: 1-based line where the row starts in a JSONL/CSV file (``None`` for Parquet).
    """

    id: object
    text: str
    row: int | None = field(default=None, compare=False)
    line: int | None = field(default=None, compare=False)


@dataclass(frozen=True)
class FieldResult:
    """One decided field.

    Attributes:
        label: index of the chosen label in ``Field.labels`` (argmax of ``probs``, unless a
            rule between fields moved it: ``changed_by_rules``).
        value: the typed value (bool for booleans, the exact schema string for enums).
        prob: probability of the chosen label, renormalised over the allowed labels (``probs[label]``).
        mass: candidate mass: unrenormalised probability of all allowed paths, in [0, 1].
        probs: probability of every label, in schema order; sums to 1.
        raw_probs: with a calibration applied (``Labeler(calibration=...)``), the decoder's
            uncalibrated ``probs``; ``None`` otherwise.
        label_set: with a calibration that has a conformal threshold, the indices of the
            labels in the field's label set, most probable first; ``None`` otherwise.
        abstained: the label set was not a single label and ``abstain_unless_single`` was
            asked: ``value`` is ``None`` (``label`` still holds the most probable label).
        order_spread: with ``--permutations``, how far the label orderings disagree on the
            chosen label: the largest minus the smallest of its probabilities over the
            orderings, in [0, 1] (``pcd_cli.decoding.permute.combine``); ``None`` otherwise.
        changed_by_rules: the schema's rules moved the label off the argmax of ``probs``
            (``pcd_cli.schema.rules``); ``probs`` are the field's own, unchanged.
        by_rule: the label was chosen by the calibration's decision rule (``pcd calibrate
            --objective``, ``FieldCalibration.decide``), not necessarily the argmax of ``probs``;
            a multi-select option so decided is chosen when its label is ``true``, whatever the
            schema's ``threshold`` (``pcd_cli.io.output.chosen_options``).
        readout: the label and ``probs`` come from the calibration's linear readout of the
            model's hidden state (``pcd calibrate --readout linear``), decided in the wave;
            ``raw_probs`` holds the decoder's own probabilities.
        features: with ``Decoder.feature_layers`` set (``pcd calibrate --readout linear``
            collecting), ``{layer: float64 (hidden_size,)}`` read at the field's decision point;
            ``None`` otherwise. Not compared, not written to outputs.
    """

    label: int
    value: bool | str | None
    prob: float
    mass: float
    probs: tuple[float, ...]
    raw_probs: tuple[float, ...] | None = None
    label_set: tuple[int, ...] | None = None
    abstained: bool = False
    changed_by_rules: bool = False
    #: the steering check moved this label (``pcd_cli.steering``): it is the label of the record
    #: without the sentences that address the labeller
    steered: bool = False
    order_spread: float | None = None
    by_rule: bool = False
    readout: bool = False
    features: dict | None = field(default=None, compare=False, repr=False)

    @property
    def raw_prob(self) -> float:
        """Uncalibrated probability of the chosen label (``prob`` when no calibration was applied)."""
        return self.prob if self.raw_probs is None else self.raw_probs[self.label]


@dataclass(frozen=True)
class RecordResult:
    """All fields of one record, in schema order, and (with tracing on) one trace per field.

    ``truncated`` is true when the text was cut to fit the model's context (``Decoder.truncate``).
    ``joint_prob``: with rules between fields, the product of the written labels' probabilities
    over the fields the rules name (``pcd_cli.schema.rules``); ``None`` without rules.
    """

    id: object
    fields: tuple[FieldResult, ...]
    traces: tuple[dict, ...] = ()
    truncated: bool = False
    joint_prob: float | None = None


@dataclass(frozen=True)
class RecordFailure:
    """A record that could not be labelled, and why.

    ``id`` is ``None`` when the row's id could not be read; ``row``/``line`` as in ``Record``.
    """

    id: object
    error: str
    row: int | None = field(default=None, compare=False)
    line: int | None = field(default=None, compare=False)
