"""The schema as data: ``Schema``, ``Field``, ``Example`` and the constants every stage shares.

A leaf of the package: no reading, no parsing. Files become these values in
``pcd_cli.schema.load`` (YAML/JSON), through ``pcd_cli.schema.jsonschema`` (JSON Schema) and
``pcd_cli.schema.pydantic`` (Pydantic models); one field's spec is checked in
``pcd_cli.schema.fields``; rules between fields live in ``pcd_cli.schema.rules``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Sequence

from ..errors import SchemaError

#: How a record's text may be put in the prompt (``Schema.record_quoting``; ``pcd_cli.decoding.prompt.quote_record``).
RECORD_QUOTINGS = ("json", "none")
#: The record quoting of a schema that does not name one: ``"json"``, the record quoted as data
#: (docs/security.md). The one definition every front-end's default comes from: ``parse_schema``,
#: a ``Schema`` built in code (``pcd serve``'s decisions and questions), ``LabelJob.record_quoting``
#: ``None`` and ``--record-quoting`` left out all mean this.
DEFAULT_RECORD_QUOTING = "json"

#: Suffixes pcd appends to a field name to form its output columns (``pcd_cli.io.output``
#: builds every column name from these; a field named like one of them is refused).
PROB_SUFFIX = "__prob"
MASS_SUFFIX = "__mass"
PROBS_SUFFIX = "__probs"
RAW_PROB_SUFFIX = "__raw_prob"
SET_SUFFIX = "__set"
ABSTAINED_SUFFIX = "__abstained"
EXPECTED_SUFFIX = "__expected"
ORDER_SPREAD_SUFFIX = "__order_spread"
#: ``<f>__steered``: the steering check moved the field's label (``pcd_cli.steering``).
STEERED_SUFFIX = "__steered"
CHANGED_SUFFIX = "__changed_by_rules"
OUTPUT_SUFFIXES = (PROB_SUFFIX, MASS_SUFFIX, PROBS_SUFFIX, RAW_PROB_SUFFIX, SET_SUFFIX, ABSTAINED_SUFFIX,
                   EXPECTED_SUFFIX, ORDER_SPREAD_SUFFIX, STEERED_SUFFIX, CHANGED_SUFFIX)
#: Whole-record output columns: the text was cut to fit the context; the joint probability of
#: the labels the rules between fields name.
TRUNCATED_COLUMN = "__truncated"
JOINT_COLUMN = "__joint_prob"
BOOLEAN_LABELS = ("true", "false")
FIELD_TYPES = ("boolean", "enum", "ordinal", "integer", "multi")
#: The null option of a nullable field: its label in ``Field.labels`` (the last one) and in
#: ``<f>__probs``; spelled ``null`` in the answer, written as a Parquet null.
NULL_LABEL = "null"
#: Most values an ``integer`` field may have (``maximum - minimum + 1``): each value is a label
#: path in the field's trie, read in the same pass.
MAX_INTEGER_VALUES = 500
#: Most options a ``multi`` field may have (each is one yes/no decision read in the same pass).
MAX_MULTI_OPTIONS = 64


def whole_number(value: object) -> int | None:
    """The whole number a gold or example cell holds as tools write it, or ``None``: an int (not
    a bool), a float or numpy number with no fraction (pandas writes an integer column that has
    gaps as float: ``4.0``), or a string of one (``"4"``, ``" 4.0 "``, ``"4.00"``; a CSV from
    such a column)."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return None
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        value = value.item()
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        if not text or not (text[0].isdigit() or text[0] in "+-."):
            return None
        try:
            value = float(text)
        except ValueError:
            return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def unescape_template(template: str) -> str:
    """``--template`` / ``--csv-delimiter`` as typed on a command line: the two-character
    escapes ``\\n`` and ``\\t`` become a newline and a tab."""
    return template.replace("\\n", "\n").replace("\\t", "\t")


class FieldKind:
    """What a field's ``type``, ``nullable`` and ``labels`` say of it; shared by ``Field`` and
    the evaluation's ``quality.data.FieldSpec`` (which is read back from an output's metadata)."""

    type: str
    labels: tuple[str, ...]
    nullable: bool

    @property
    def is_multi(self) -> bool:
        return self.type == "multi"

    @property
    def is_scale(self) -> bool:
        """Ordinal or integer: the labels are ordered; ``<f>__expected``, MAE and QWK apply."""
        return self.type in ("ordinal", "integer")

    def is_null(self, label_index: int) -> bool:
        """Whether ``label_index`` is the null option of a nullable field."""
        return self.nullable and label_index == len(self.labels) - 1


@dataclass(frozen=True)
class Field(FieldKind):
    """One field of the schema: a closed decision, or (``type: multi``) a set of them.

    Decision types: ``boolean``, ``enum``, ``ordinal`` (an enum whose labels are in order,
    lowest first) and ``integer`` (the values ``minimum..maximum``; labels are their decimal
    strings, spelled unquoted). A ``multi`` field (multi-select) is declared with its options
    in ``labels``; ``Schema`` expands it into one boolean decision per option
    (``group``/``option`` set), read in the same pass as every other field.

    Attributes:
        name: the JSON key, written verbatim (JSON-escaped) into the answer line; for an
            option decision ``<multi field>.<option>`` (the key written is ``group``).
        type: one of ``FIELD_TYPES``.
        description: shown in the prompt's catalog.
        labels: allowed values as schema strings; ``("true", "false")`` for booleans; for a
            nullable field the last label is ``NULL_LABEL``; for ``multi``, the options.
        depends_on: names of fields whose written answers this field must see.
        abstain_below: leave the field without a label (null, ``<f>__abstained``) when the
            chosen label's probability is below this, in (0, 1); ``None``: always decide.
        nullable: the last label is the null option (spelled ``null``, value ``None``).
        none_label: the enum label added as "none of these" (``none_label:``), else ``None``;
            it is an ordinary label, scored like the others.
        threshold, min_items, max_items: ``multi`` only: an option is chosen when its
            P(yes) >= ``threshold``; the most probable options are added (removed) to reach
            ``min_items`` (at most ``max_items``).
        group, option, group_size: for an option decision of a multi field: the multi
            field's name, this option and the number of options.
    """

    name: str
    type: str
    description: str
    labels: tuple[str, ...]
    depends_on: tuple[str, ...] = ()
    abstain_below: float | None = None
    nullable: bool = False
    none_label: str | None = None
    threshold: float = 0.5
    min_items: int = 0
    max_items: int | None = None
    group: str | None = None
    option: str | None = None
    group_size: int = 0

    @property
    def is_boolean(self) -> bool:
        return self.type == "boolean"

    def scale_values(self) -> list[tuple[int, float]]:
        """``(label index, value)`` of the labels on the scale: integers their value, ordinal
        labels their position from 0; the null option and the ``none_label`` are not on it."""
        out = []
        for i, label in enumerate(self.labels):
            if self.is_null(i) or label == self.none_label:
                continue
            out.append((i, float(int(label)) if self.type == "integer" else float(len(out))))
        return out

    def value(self, label_index: int) -> bool | int | str | None:
        """The typed output value of label ``label_index``: bool for booleans, int for
        integers, ``None`` for the null option, else the exact label string."""
        if self.is_null(label_index):
            return None
        if self.is_boolean:
            return self.labels[label_index] == "true"
        if self.type == "integer":
            return int(self.labels[label_index])
        return self.labels[label_index]

    def label_index(self, value: object, *, where: str = "") -> int:
        """Index of a gold or example value: a label string; for booleans ``True``/``False``
        or ``"true"``/``"false"`` (any case); for integers a whole number as tools write it
        (``4``, ``4.0``, ``"4"``, ``"4.0"``: ``whole_number``); for enum and ordinal labels
        that are whole numbers (``"4"``), also such a number; ``None`` for the null option of
        a nullable field.

        Raises:
            SchemaError: the value is not a label of this field (names ``where`` and the field).
        """
        key = value
        if value is None and self.nullable:
            return len(self.labels) - 1
        if self.is_boolean:
            if isinstance(value, bool):
                key = "true" if value else "false"
            elif isinstance(value, str):
                key = value.strip().lower()
        elif self.type == "integer":
            number = whole_number(value)
            key = str(number) if number is not None else value.strip() if isinstance(value, str) else value
        if isinstance(key, str) and key in self.labels and not (self.nullable and key == NULL_LABEL):
            return self.labels.index(key)
        number = None if self.is_boolean or self.type == "integer" else whole_number(value)
        if number is not None and str(number) in self.labels:  # an ordinal 1..5 written 4 or 4.0
            return self.labels.index(str(number))
        allowed = " | ".join(self.labels) if self.type != "integer" else f"{self.labels[0]}..{self.labels[-1]}"
        raise SchemaError(f"{where + ': ' if where else ''}field {self.name!r}: {value!r} is not one of its labels "
                          f"({allowed})")

    def spellings(self, label_index: int) -> tuple[str, ...]:
        """JSON spellings of a label, canonical first (docs/how-it-works.md, decoding rule 5).

        Booleans and integers: unquoted and quoted (``true``/``"true"``, ``7``/``"7"``); the
        null option: ``null``; enum and ordinal labels: the label as a JSON string with
        minimal escaping (quotes, backslashes, control characters; ``/`` and non-ASCII kept).
        """
        label = self.labels[label_index]
        if self.is_null(label_index):
            return (NULL_LABEL,)
        if self.is_boolean or self.type == "integer":
            return (label, json_string(label))
        return (json_string(label),)


@dataclass(frozen=True)
class Example:
    """A few-shot example: an input and its answer, shown to the model as a prior exchange.

    Attributes:
        labels: label index per field, in schema order (every field has one).
        text: the example's input text (``None`` when given as ``columns``).
        columns: column values for ``--template`` (``None`` when given as ``text``).
        source: where it came from, for messages (``examples[0]``, ``gold row 17``).
    """

    labels: tuple[int, ...]
    text: str | None = None
    columns: tuple[tuple[str, str], ...] | None = None
    source: str = "example"

    def render_text(self, template: str | None) -> str:
        """The example's input as the prompt shows it: ``text``, or ``columns`` filled into ``template``.

        Raises:
            SchemaError: ``columns`` without a template, or a template column the example lacks.
        """
        if self.text is not None:
            return self.text
        if template is None:
            raise SchemaError(f"{self.source}: gives 'columns', which need --template to become a text")
        values = dict(self.columns or ())
        try:
            text = unescape_template(template).format_map(values)
        except (KeyError, IndexError, ValueError) as exc:
            raise SchemaError(f"{self.source}: --template cannot be filled from its columns ({exc})") from None
        if not text.strip():
            raise SchemaError(f"{self.source}: its text is empty")
        return text.strip()


def decision_labels(declared: tuple["Field", ...], values: dict, *, where: str = "") -> tuple[int, ...]:
    """Label index per decision (``Schema.fields`` order) of one answer given per declared field.

    ``values`` maps each declared field to its value (``Field.label_index``); a multi field's
    value is a list of its options (those answered yes), which becomes one boolean decision
    per option (index 0 = true, 1 = false).

    Raises:
        SchemaError: a value is not a label, or a multi value is not a list of its options
            (names ``where`` and the field).
    """
    indices: list[int] = []
    for f in declared:
        value = values.get(f.name)
        if not f.is_multi:
            indices.append(f.label_index(value, where=where))
            continue
        if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)):
            raise SchemaError(f"{where + ': ' if where else ''}field {f.name!r}: a multi-select value must be a "
                              f"list of its options, got {value!r}")
        unknown = [v for v in value if v not in f.labels]
        if unknown:
            raise SchemaError(f"{where + ': ' if where else ''}field {f.name!r}: {unknown[0]!r} is not one of its "
                              f"options ({' | '.join(f.labels)})")
        indices.extend(0 if option in value else 1 for option in f.labels)
    return tuple(indices)



@dataclass(frozen=True)
class Schema:
    """A validated schema: ordered fields and the waves they are decided in.

    Attributes:
        name: schema name (from the file, else the file stem).
        instructions: extra text for the prompt's system turn ('' if none).
        fields: the decisions in schema order (the order of the JSON object): every field,
            with a multi field expanded into one boolean decision per option.
        waves: tuples of field indices; wave 0 is the first field alone (docs/how-it-works.md, decoding rule 8),
            later waves follow ``depends_on`` levels.
        warnings: soft problems found while validating.
        examples: few-shot examples from the schema's ``examples:`` key.
        source_sha256: sha256 of the canonical JSON form of the schema (for output metadata).
        declared: the fields as declared (a multi field once, its options in ``labels``);
            output columns, gold values and examples follow these.
        parts: per declared field, the indices of its decisions in ``fields``.
    """

    name: str
    instructions: str
    fields: tuple[Field, ...]
    waves: tuple[tuple[int, ...], ...]
    warnings: tuple[str, ...] = ()
    source_sha256: str = ""
    examples: tuple[Example, ...] = ()
    declared: tuple[Field, ...] = ()
    parts: tuple[tuple[int, ...], ...] = ()
    #: rules between fields (``pcd_cli.schema.rules.Rule``), applied after decoding
    rules: tuple = ()
    #: ``isolate_fields: true`` (issue #35 item 3): every declared field is decided in its own
    #: branch of the record's prompt, seeing only itself (``field_alone``), so its label does not
    #: depend on the other fields, their order or their count.
    isolate_fields: bool = False
    #: With ``isolate_fields``: the JSON key every field's branch writes instead of its name
    #: (``pcd serve``'s isolated questions are all asked as ``"answer"``); ``None``: the field's name.
    isolated_key: str | None = None
    #: How the record's text is put in the prompt (``pcd_cli.decoding.prompt.RECORD_QUOTINGS``,
    #: docs/security.md): ``"json"`` (``DEFAULT_RECORD_QUOTING``) quotes it as one JSON string and
    #: the system text says it is data to judge, never instructions; ``"none"`` (the schema's
    #: ``record_quoting: none``, an opt-out) puts it in as it is, the prompt of earlier releases.
    record_quoting: str = DEFAULT_RECORD_QUOTING

    def __post_init__(self) -> None:
        if not self.declared:  # built from decisions alone: every field is one decision
            object.__setattr__(self, "declared", self.fields)
            object.__setattr__(self, "parts", tuple((i,) for i in range(len(self.fields))))

    def declared_parts(self) -> list[tuple[Field, tuple[int, ...]]]:
        """``(declared field, its decision indices)`` in schema order: one index for a
        decision type, one per option for a multi field."""
        return list(zip(self.declared, self.parts))

    def field_index(self, name: str) -> int:
        for i, f in enumerate(self.fields):
            if f.name == name:
                return i
        raise KeyError(name)

    def check_output_columns(self, reserved: str) -> None:
        """Raise ``SchemaError`` if a field's output column would clash with ``reserved``
        (the id column, or ``__truncated``)."""
        for f in self.declared:
            if f.name == reserved:
                if reserved.startswith("__"):
                    raise SchemaError(f"field {f.name!r}: clashes with the output column {reserved!r}; rename the field")
                raise SchemaError(f"field {f.name!r}: clashes with the id column {reserved!r}; "
                                  "rename the field or pass another --id-field")


def field_alone(schema: Schema, index: int, key: str | None = None) -> Schema:
    """The one-field schema of ``schema``'s declared field ``index``: its decisions only (every
    option of a multi field), ``schema``'s instructions, one wave; ``key`` renames the field
    (its options become ``<key>.<option>``). What an isolated field's branch is compiled from
    (``Schema.isolate_fields``): it depends on that field and the instructions, nothing else.

    Raises:
        IndexError: ``index`` is not a declared field's.
    """
    declared = schema.declared[index]
    decisions = tuple(schema.fields[i] for i in schema.parts[index])
    if key is not None and key != declared.name:
        declared = dataclasses.replace(declared, name=key)
        decisions = tuple(dataclasses.replace(d, name=f"{key}.{d.option}", group=key) if d.group is not None
                          else dataclasses.replace(d, name=key) for d in decisions)
    decisions = tuple(dataclasses.replace(d, depends_on=()) for d in decisions)
    canonical = json.dumps([schema.instructions, declared.name, declared.type, declared.description,
                            list(declared.labels), [d.name for d in decisions]], ensure_ascii=False)
    return Schema(name=f"{schema.name}.{declared.name}", instructions=schema.instructions, fields=decisions,
                  waves=(tuple(range(len(decisions))),), source_sha256=hashlib.sha256(canonical.encode()).hexdigest(),
                  declared=(dataclasses.replace(declared, depends_on=()),), parts=(tuple(range(len(decisions))),),
                  record_quoting=schema.record_quoting)


def fields_subset(schema: Schema, names: Sequence[str]) -> Schema:
    """``schema`` with only its declared fields ``names`` (in schema order), their decisions,
    names and parts as in ``schema``, no rules: the fields of a row that ``pcd label --reuse``
    decodes while it copies the others (``isolate_fields``, where each field's value depends on
    that field and the instructions only: ``field_alone``). Its ``source_sha256`` is
    ``schema``'s: it names the run's schema, not a schema of its own.

    Raises:
        KeyError: a name that is not a declared field of ``schema``.
    """
    known = {f.name for f in schema.declared}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise KeyError(f"not a declared field: {unknown[0]!r}")
    fields, declared, parts = [], [], []
    for f, part in schema.declared_parts():
        if f.name in names:
            declared.append(f)
            parts.append(tuple(range(len(fields), len(fields) + len(part))))
            fields += [schema.fields[i] for i in part]
    return dataclasses.replace(schema, fields=tuple(fields), waves=(tuple(range(len(fields))),), rules=(),
                               declared=tuple(declared), parts=tuple(parts), examples=())


def schema_metadata(schema: Schema) -> dict[str, str]:
    """The schema's part of an output's key-value metadata.

    ``pcd.schema_json``: compact JSON ``{field: [labels...]}`` per declared field (a multi
    field's options; a nullable field's last label ``null``), read by ``pcd eval``;
    ``pcd.field_types``: ``{field: {"type": ..., "nullable": ..., "none_label": ...}}`` for
    the fields that are not plain booleans or enums (absent when there are none, so older
    outputs and newer ones of plain schemas match).
    """
    out = {"pcd.schema_name": schema.name, "pcd.schema_sha256": schema.source_sha256,
           "pcd.schema_json": json.dumps({f.name: list(f.labels) for f in schema.declared}, separators=(",", ":"),
                                         ensure_ascii=False)}
    types = {f.name: {"type": f.type} | type_options(f) for f in schema.declared
             if f.type not in ("boolean", "enum") or type_options(f)}
    if types:
        out["pcd.field_types"] = json.dumps(types, separators=(",", ":"), ensure_ascii=False)
    return out


def json_string(text: str) -> str:
    """``text`` as a JSON string literal with minimal escaping (RFC 8259 §7); '/' is not escaped."""
    return json.dumps(text, ensure_ascii=False)


#: Keys a schema in pcd's own format may have at the top level, and in each field.
TOP_KEYS = ("name", "instructions", "fields", "examples", "rules", "isolate_fields", "record_quoting")
FIELD_KEYS = ("type", "description", "labels", "choices", "depends_on", "abstain_below", "nullable", "none_label",
              "minimum", "maximum", "threshold", "min_items", "max_items")
#: ``written`` for a JSON file: a value's text is its JSON spelling (JSON converts nothing).
JSON_TEXT = object()


class Unparsed:
    """A field a converter (JSON Schema, Pydantic) could not turn into pcd's format: it holds
    the problems found, reported in the field's place with the rest of the schema's."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)


def type_options(f: Field) -> dict:
    """The options of a field beyond name/type/labels/depends_on, for the schema hash (empty
    for the options every field had before them, so older schemas keep their hash)."""
    out = {}
    if f.nullable:
        out["nullable"] = True
    if f.none_label is not None:
        out["none_label"] = f.none_label
    if f.is_multi:
        out.update(threshold=f.threshold, min_items=f.min_items, max_items=f.max_items)
    return out
