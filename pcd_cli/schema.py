"""Schema files -> validated, frozen ``Schema`` values.

Accepted files (YAML or JSON, chosen by extension, content sniffed for ``.json``):

* pcd's own format::

      name: triage
      instructions: optional text for the system turn
      fields:                       # ordered mapping
        sentiment: {type: enum, description: ..., labels: [NEGATIVE, POSITIVE]}
        urgent:    {type: boolean, description: ...}
        route:     {type: enum, labels: [...], depends_on: [urgent]}

  ``choices`` is accepted as a synonym of ``labels`` (the preset files use it), and
  ``fields`` may also be a list of ``{name: ..., type: ...}`` items. An optional
  ``examples:`` list holds few-shot examples for the prompt head (``Example``)::

      examples:
        - text: "Flight delayed 5 hours, no food vouchers."
          labels: {sentiment: NEGATIVE}
        - columns: {subject: "Refund", body: "..."}     # with --template
          labels: {sentiment: NEUTRAL}

  An optional ``rules:`` list holds rules between fields (``pcd_cli.rules``), e.g.
  ``{if: {sentiment: NEGATIVE}, then: {urgent: true}}``; ``Schema.rules``.
* a JSON Schema object (as ``Model.model_json_schema()`` writes it) whose properties are
  ``{"type": "boolean"}``, ``{"enum": [...]}`` or an ``anyOf``/``oneOf`` of ``const`` parts,
  directly or through local ``$ref`` (``#/$defs/...``, ``#/definitions/...``) and a
  single-part ``allOf``; ``description`` (else a ``title`` that says more than the name) is
  kept. Anything else (free text, numbers, lists, objects, ``Optional`` / a ``null`` branch,
  a ``$ref`` to another file) is a problem naming the field and the construct.

Everything is validated before any record is read, and every problem of the schema is
reported at once: one ``SchemaError`` whose message is the problem itself, or
``<file> has N problems:`` and one line per problem, each naming the field. A label that
YAML turned into a boolean, number or date (``NO``, ``007``) is named as written in the
file, with the quoted spelling to use. Soft problems (labels that differ only by case, a
label with surrounding whitespace) are collected in ``Schema.warnings``.

Whitespace in labels: a label that is only whitespace, and labels that differ only by
surrounding whitespace (``"yes"``/``"yes "``), are errors: to the model they read as the
same word in the catalog (or as nothing), and they are almost always a stray space in the
schema file. A single label with surrounding whitespace is a warning, not an error: it is
kept and returned exactly, since a downstream system may need that exact string, but the
model must write the space inside the quotes to pick it, which it rarely does.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .errors import SchemaError

#: Suffixes pcd appends to a field name to form its output columns.
OUTPUT_SUFFIXES = ("__prob", "__mass", "__probs", "__raw_prob", "__set", "__abstained", "__expected",
                   "__changed_by_rules")
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
        or ``"true"``/``"false"`` (any case); for integers an int or its decimal string;
        ``None`` for the null option of a nullable field.

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
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if isinstance(value, int) and not isinstance(value, bool):
                key = str(value)
            elif isinstance(value, str):
                key = value.strip()
        if isinstance(key, str) and key in self.labels and not (self.nullable and key == NULL_LABEL):
            return self.labels.index(key)
        allowed = " | ".join(self.labels) if self.type != "integer" else f"{self.labels[0]}..{self.labels[-1]}"
        raise SchemaError(f"{where + ': ' if where else ''}field {self.name!r}: {value!r} is not one of its labels "
                          f"({allowed})")

    def spellings(self, label_index: int) -> tuple[str, ...]:
        """JSON spellings of a label, canonical first (DESIGN.md §2 rule 5).

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


def parse_example(schema_fields: tuple["Field", ...], data: Any, source: str) -> Example:
    """Validate one example ``{text: ..., labels: {field: value}}`` (or ``columns:`` for templates).

    ``schema_fields`` are the declared fields (``Schema.declared``). Booleans may be given as
    JSON booleans or ``"true"``/``"false"``; enum values must be exact labels; a multi field
    takes a list of its options; a nullable field may be null. ``Example.labels`` holds one
    index per decision (``decision_labels``).

    Raises:
        SchemaError: names the example (``source``) and the field: a missing field, a value
            that is not a label, an unknown field, or no text.
    """
    if not isinstance(data, dict):
        raise SchemaError(f"{source}: expected a mapping with 'text' (or 'columns') and 'labels'")
    text, columns, labels = data.get("text"), data.get("columns"), data.get("labels")
    if (text is None) == (columns is None):
        raise SchemaError(f"{source}: give exactly one of 'text' or 'columns'")
    if text is not None and (not isinstance(text, str) or not text.strip()):
        raise SchemaError(f"{source}: 'text' must be a non-empty string")
    if columns is not None:
        if not isinstance(columns, dict) or not columns:
            raise SchemaError(f"{source}: 'columns' must be a mapping of column -> text")
        bad = [k for k, v in columns.items() if not isinstance(v, (str, int, float)) or isinstance(v, bool)]
        if bad:
            raise SchemaError(f"{source}: column {bad[0]!r} must be text")
    if not isinstance(labels, dict):
        raise SchemaError(f"{source}: 'labels' must be a mapping of field -> value")
    names = {f.name for f in schema_fields}
    unknown = [k for k in labels if k not in names]
    if unknown:
        raise SchemaError(f"{source}: field {unknown[0]!r} is not in the schema")
    for f in schema_fields:
        if f.name not in labels or (labels[f.name] is None and not f.nullable):
            raise SchemaError(f"{source}: field {f.name!r} has no value; an example must answer every field")
    return Example(labels=decision_labels(schema_fields, labels, where=source), text=text.strip() if text is not None else None,
                   columns=tuple((str(k), str(v)) for k, v in columns.items()) if columns is not None else None,
                   source=source)


@dataclass(frozen=True)
class Schema:
    """A validated schema: ordered fields and the waves they are decided in.

    Attributes:
        name: schema name (from the file, else the file stem).
        instructions: extra text for the prompt's system turn ('' if none).
        fields: the decisions in schema order (the order of the JSON object): every field,
            with a multi field expanded into one boolean decision per option.
        waves: tuples of field indices; wave 0 is the first field alone (DESIGN.md §2 rule 8),
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
    #: rules between fields (``pcd_cli.rules.Rule``), applied after decoding
    rules: tuple = ()

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
    types = {f.name: {"type": f.type} | _type_options(f) for f in schema.declared
             if f.type not in ("boolean", "enum") or _type_options(f)}
    if types:
        out["pcd.field_types"] = json.dumps(types, separators=(",", ":"), ensure_ascii=False)
    return out


def json_string(text: str) -> str:
    """``text`` as a JSON string literal with minimal escaping (RFC 8259 §7); '/' is not escaped."""
    return json.dumps(text, ensure_ascii=False)


class _RepeatedKey(ValueError):
    """A mapping of a schema file names a key twice."""


def _unique_json_object(pairs: list[tuple[str, Any]]) -> dict:
    """``json.loads`` hook: a JSON object whose key repeats raises ``_RepeatedKey``."""
    seen: dict[str, int] = {}
    for i, (key, _) in enumerate(pairs):
        if key in seen:
            raise _RepeatedKey(f"key {key!r} appears twice in one JSON object (entries {seen[key] + 1} and {i + 1})")
        seen[key] = i
    return dict(pairs)


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that repeats a key (PyYAML keeps the last one)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: PyYAML's own error follows
                continue
            if first is not None:
                raise _RepeatedKey(f"key {key!r} appears twice in one YAML mapping (lines {first + 1} and "
                                   f"{key_node.start_mark.line + 1})")
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def load_schema(path: str | Path) -> Schema:
    """Read and validate a schema file (YAML, JSON, or ``models.py:Model``: a Pydantic model,
    see ``pcd_cli.schema_pydantic``).

    Raises:
        SchemaError: unreadable file, or every validation problem at once (see ``parse_schema``).
    """
    if str(path).endswith(".py") or ".py:" in str(path):  # a Pydantic model: models.py:MyModel
        from .schema_pydantic import load_model_schema

        return load_model_schema(str(path))
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SchemaError(f"schema file {str(path)!r}: cannot read it ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise SchemaError(f"schema file {str(path)!r}: not UTF-8 text (byte {exc.start})") from exc
    if not text.strip():
        raise SchemaError(f"schema file {str(path)!r} is empty; see schemas/ for examples")
    is_json = path.suffix.lower() == ".json"
    try:
        if is_json:
            data = json.loads(text, object_pairs_hook=_unique_json_object)
        else:
            data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except _RepeatedKey as exc:
        raise SchemaError(f"schema file {str(path)!r}: {exc}; a name given twice is never resolved silently "
                          "(remove or rename one)") from None
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SchemaError(f"schema file {str(path)!r}: not valid {path.suffix.lstrip('.').upper() or 'YAML'}: {exc}") from exc
    written: Any = _JSON_TEXT
    if not is_json:
        try:
            written = yaml.load(text, Loader=yaml.BaseLoader)  # noqa: S506 - every scalar as the text written
        except yaml.YAMLError:  # only for messages: without it they show the values as read
            written = None
    return parse_schema(data, default_name=path.stem, source=str(path), written=written)


#: Keys a schema in pcd's own format may have at the top level, and in each field.
TOP_KEYS = ("name", "instructions", "fields", "examples", "rules")
FIELD_KEYS = ("type", "description", "labels", "choices", "depends_on", "abstain_below", "nullable", "none_label",
              "minimum", "maximum", "threshold", "min_items", "max_items")
#: ``written`` for a JSON file: a value's text is its JSON spelling (JSON converts nothing).
_JSON_TEXT = object()


class Unparsed:
    """A field a converter (JSON Schema, Pydantic) could not turn into pcd's format: it holds
    the problems found, reported in the field's place with the rest of the schema's."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)


def _check_keys(mapping: dict, known: tuple[str, ...], where: str, problems: list[str] | None = None) -> None:
    """Refuse a key pcd does not know (a typo like ``descripton`` would otherwise be ignored
    silently), naming it and the nearest known key; every unknown key is one problem.

    Raises:
        SchemaError: ``<where>: unknown key 'descripton' (did you mean 'description'?)``, when
            ``problems`` is not given (else the messages are appended to it).
    """
    import difflib

    found = []
    for key in mapping:
        if key not in known:
            near = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            hint = f"did you mean {near[0]!r}?" if near else f"known keys: {', '.join(known)}"
            found.append(f"{where}: unknown key {key!r} ({hint})")
    if problems is None:
        _raise_all(found, "schema")
    else:
        problems.extend(found)


def _raise_all(problems: list[str], source: str) -> None:
    """Raise one ``SchemaError`` for ``problems``: the message itself when there is one, else
    ``<source> has N problems:`` and one indented line each."""
    if len(problems) == 1:
        raise SchemaError(problems[0])
    if problems:
        raise SchemaError(f"{source} has {len(problems)} problems:\n" + "\n".join(f"  {p}" for p in problems))


def parse_schema(data: Any, *, default_name: str = "schema", source: str = "schema", written: Any = None) -> Schema:
    """Validate a schema given as plain Python data (the parsed file).

    Every problem of the schema is found before raising: fields that cannot be read, unknown
    keys, bad or duplicate labels, clashing names, bad ``depends_on``, then (when the fields
    are sound) the examples.

    Args:
        data: the parsed file.
        default_name: the schema's name when ``data`` has none.
        source: how the messages name the schema (the file's path) when there are several problems.
        written: the same file loaded with every scalar as the text written (YAML's
            ``BaseLoader``), so a label that YAML turned into a boolean or number is named as
            written (``NO``, ``007``); ``_JSON_TEXT`` for a JSON file; ``None``: plain data.

    Raises:
        SchemaError: the one problem found, or ``<source> has N problems:`` and one line each.
    """
    problems: list[str] = []
    if not isinstance(data, dict):
        raise SchemaError("schema: expected a mapping with a 'fields' key at the top level")
    warnings: list[str] = []
    if "properties" in data and "fields" not in data:
        from .schema_jsonschema import from_json_schema

        data = from_json_schema(data, problems, warnings)
        written = _JSON_TEXT if written is _JSON_TEXT else None  # a JSON Schema in YAML: plain messages
    raw_fields_written = written.get("fields") if isinstance(written, dict) else None
    if "schema" in data and "fields" not in data and isinstance(data["schema"], dict):
        data = {"name": data.get("id", default_name), "fields": data["schema"]}  # preset files
        raw_fields_written = written.get("schema") if isinstance(written, dict) else None
    _check_keys(data, TOP_KEYS, "schema", problems)
    raw_fields = data.get("fields")
    if raw_fields is None or (hasattr(raw_fields, "__len__") and len(raw_fields) == 0):
        if not any("(did you mean 'fields'?)" in p for p in problems):  # else that says it already
            problems.append("schema: no fields; add at least one field under 'fields'")
        _raise_all(problems, source)
    from .schema_fields import parse_field  # one field's spec -> Field, or its problems

    items = _field_items(raw_fields, problems)
    fields: list[Field] = []
    all_names = {name for name, _ in items if isinstance(name, str)}  # read or not (for depends_on)
    seen: set[str] = set()
    for i, (name, spec) in enumerate(items):
        spec_written, name_written = _written_field(written, raw_fields, raw_fields_written, i, name)
        f, warns = parse_field(name, spec, problems, spec_written, name_written=name_written,
                                all_names=all_names, first=i == 0)
        if isinstance(name, str) and name in seen:
            problems.append(f"field {name!r}: defined twice")
            continue
        if isinstance(name, str):
            seen.add(name)
        if f is not None:
            fields.append(f)
            warnings.extend(warns)
    for f in fields:
        for suffix in OUTPUT_SUFFIXES:
            if f.name.endswith(suffix) and f.name[: -len(suffix)] in seen:
                problems.append(f"field {f.name!r}: clashes with the output column {f.name!r} of field "
                                f"{f.name[: -len(suffix)]!r}; rename it")
                break
    names = {f.name for f in fields}
    for f in fields:
        for option in (f.labels if f.is_multi else ()):
            if f"{f.name}.{option}" in names:
                problems.append(f"field {f.name + '.' + option!r}: clashes with option {option!r} of the multi-select "
                                f"field {f.name!r} (decided as {f.name + '.' + option!r}); rename one")
    first_read = bool(fields) and bool(items) and fields[0].name == items[0][0]
    waves = _waves(fields, problems, checked=True, first_read=first_read) if fields else ()
    name = data.get("name", default_name)
    instructions = data.get("instructions") or ""
    if not isinstance(name, str) or not isinstance(instructions, str):
        problems.append("schema: 'name' and 'instructions' must be strings")
    raw_examples = data.get("examples") or []
    if not isinstance(raw_examples, list):
        problems.append("schema: 'examples' must be a list of {text: ..., labels: {...}}")
    _raise_all(problems, source)
    examples = []  # checked against sound fields only: an example of a broken field says nothing
    for i, ex in enumerate(raw_examples):
        try:
            examples.append(parse_example(tuple(fields), ex, f"examples[{i}]"))
        except SchemaError as exc:
            problems.append(str(exc))
    from .rules import parse_rules

    rules = parse_rules(data.get("rules"), tuple(fields), problems, warnings)  # against sound fields, like examples
    _raise_all(problems, source)
    canonical_data = {"name": name, "instructions": instructions,
                      "fields": [[f.name, f.type, f.description, list(f.labels), list(f.depends_on)]
                                 + ([_type_options(f)] if _type_options(f) else []) for f in fields]}
    if examples:  # schemas without examples keep the hash they had before examples existed
        canonical_data["examples"] = [[e.text, e.columns, list(e.labels)] for e in examples]
    if rules:  # likewise for rules
        canonical_data["rules"] = [r.to_dict() for r in rules]
    canonical = json.dumps(canonical_data, ensure_ascii=False, sort_keys=True)
    decisions, parts = _expand(fields)
    return Schema(name=name, instructions=instructions.strip(), fields=decisions,
                  waves=tuple(tuple(d for fi in wave for d in parts[fi]) for wave in waves), warnings=tuple(warnings),
                  source_sha256=hashlib.sha256(canonical.encode()).hexdigest(), examples=tuple(examples),
                  declared=tuple(fields), parts=parts, rules=rules)


def _type_options(f: Field) -> dict:
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


def _expand(fields: list[Field]) -> tuple[tuple[Field, ...], tuple[tuple[int, ...], ...]]:
    """Declared fields -> decisions: a multi field becomes one boolean decision per option,
    named ``<field>.<option>``, which the answer writes as ``"<field>": {"<option>": true, ...}``
    (``prompt.Layout``); every other field is its own decision. Returns the decisions and,
    per declared field, its decision indices."""
    decisions: list[Field] = []
    parts = []
    for f in fields:
        if not f.is_multi:
            parts.append((len(decisions),))
            decisions.append(f)
            continue
        parts.append(tuple(range(len(decisions), len(decisions) + len(f.labels))))
        decisions.extend(Field(name=f"{f.name}.{option}", type="boolean", description=f.description,
                               labels=BOOLEAN_LABELS, depends_on=f.depends_on, group=f.name, option=option,
                               group_size=len(f.labels)) for option in f.labels)
    return tuple(decisions), tuple(parts)


def _written_field(written: Any, raw_fields: Any, raw_written: Any, i: int, name: Any) -> tuple[Any, Any]:
    """The field's spec and name as written in the file (``BaseLoader``), found at the same
    place; ``_JSON_TEXT`` / ``None`` as ``written`` says when there is no such text."""
    if written is None or written is _JSON_TEXT:
        return written, written
    if isinstance(raw_fields, dict) and isinstance(raw_written, dict):
        if isinstance(name, str):
            return raw_written.get(name), name
        keys = list(raw_written)  # a name YAML converted: same position (when nothing was merged in)
        if len(keys) == len(raw_fields):
            return raw_written[keys[i]], keys[i]
        return None, None
    if isinstance(raw_fields, list) and isinstance(raw_written, list) and len(raw_written) == len(raw_fields):
        item = raw_written[i]
        if isinstance(item, dict):
            return {k: v for k, v in item.items() if k != "name"}, item.get("name")
    return None, None


def _field_items(raw_fields: Any, problems: list[str]) -> list[tuple[Any, Any]]:
    if isinstance(raw_fields, dict):
        return list(raw_fields.items())
    if isinstance(raw_fields, list):
        items = []
        for i, spec in enumerate(raw_fields):
            if not isinstance(spec, dict) or "name" not in spec:
                problems.append(f"fields[{i}]: a list item needs a 'name' key")
                continue
            items.append((spec["name"], {k: v for k, v in spec.items() if k != "name"}))
        return items
    problems.append("schema: 'fields' must be a mapping (name -> spec) or a list")
    return []


def _depends_problems(name: str, depends_on: list[str], all_names: set[str], first: bool) -> list[str]:
    """What is wrong with a field's ``depends_on`` on its own: unknown names, its own name, the first field."""
    found = []
    for dep in depends_on:
        if dep not in all_names:
            found.append(f"field {name!r}: depends_on names an unknown field {dep!r}")
        elif dep == name:
            found.append(f"field {name!r}: depends_on names the field itself")
    if first and depends_on:
        found.append(f"field {name!r}: the first field is decided first and cannot depend on others")
    return found


def _waves(fields: list[Field], problems: list[str], *, checked: bool = False,
           first_read: bool = True) -> tuple[tuple[int, ...], ...]:
    """Decision waves: the first field alone, then ``depends_on`` levels (DESIGN.md §2 rule 8).

    Cycles are appended to ``problems`` (each once); so are unknown names, a field naming
    itself and a first field that depends, unless ``checked`` (``schema_fields.parse_field`` did). A
    dependency on a field not in ``fields`` (one that could not be read) is skipped;
    ``first_read``: ``fields[0]`` is the schema's first field (else it is walked like the rest).
    """
    index = {f.name: i for i, f in enumerate(fields)}
    deps: dict[int, list[int]] = {}
    for i, f in enumerate(fields):
        if not checked:
            problems.extend(_depends_problems(f.name, list(f.depends_on), set(index), i == 0))
        deps[i] = [index[d] for d in f.depends_on if d in index and d != f.name]
    if not fields:
        return ()
    level: dict[int, int] = {0: 0} if first_read else {}
    visiting: set[int] = set()

    def level_of(i: int) -> int:
        if i in level:
            return level[i]
        if i in visiting:
            problems.append(f"field {fields[i].name!r}: depends_on forms a cycle")
            level[i] = 0  # placeholder: reported once, the walk goes on
            return 0
        visiting.add(i)
        below = [level_of(d) for d in deps[i]]
        visiting.discard(i)
        level[i] = max(level.get(i, 0), 1 + max(below, default=0))
        return level[i]

    for i in range(len(fields)):
        level_of(i)
    n_waves = max(level.values()) + 1
    return tuple(tuple(i for i in range(len(fields)) if level[i] == w) for w in range(n_waves)
                 if any(level[i] == w for i in range(len(fields))))
