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
* a JSON Schema object whose properties are ``{"type": "boolean"}`` or
  ``{"enum": [...]}`` (``description`` kept).

Everything is validated before any record is read; the first problem raises
``SchemaError`` naming the field and the problem. Soft problems (labels that differ only by
case, a label with surrounding whitespace) are collected in ``Schema.warnings``.

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
OUTPUT_SUFFIXES = ("__prob", "__mass", "__probs", "__raw_prob")
BOOLEAN_LABELS = ("true", "false")
FIELD_TYPES = ("boolean", "enum")


def unescape_template(template: str) -> str:
    """``--template`` / ``--csv-delimiter`` as typed on a command line: the two-character
    escapes ``\\n`` and ``\\t`` become a newline and a tab."""
    return template.replace("\\n", "\n").replace("\\t", "\t")


@dataclass(frozen=True)
class Field:
    """One closed decision of the schema.

    Attributes:
        name: the JSON key, written verbatim (JSON-escaped) into the answer line.
        type: ``"boolean"`` or ``"enum"``.
        description: shown in the prompt's catalog.
        labels: allowed values as schema strings; ``("true", "false")`` for booleans.
        depends_on: names of fields whose written answers this field must see.
    """

    name: str
    type: str
    description: str
    labels: tuple[str, ...]
    depends_on: tuple[str, ...] = ()

    @property
    def is_boolean(self) -> bool:
        return self.type == "boolean"

    def value(self, label_index: int) -> bool | str:
        """The typed output value of label ``label_index`` (bool for booleans, the exact string otherwise)."""
        if self.is_boolean:
            return self.labels[label_index] == "true"
        return self.labels[label_index]

    def label_index(self, value: object, *, where: str = "") -> int:
        """Index of a gold or example value: a label string, or for booleans ``True``/``False``
        or ``"true"``/``"false"`` (any case).

        Raises:
            SchemaError: the value is not a label of this field (names ``where`` and the field).
        """
        key = value
        if self.is_boolean:
            if isinstance(value, bool):
                key = "true" if value else "false"
            elif isinstance(value, str):
                key = value.strip().lower()
        if isinstance(key, str) and key in self.labels:
            return self.labels.index(key)
        allowed = " | ".join(self.labels)
        raise SchemaError(f"{where + ': ' if where else ''}field {self.name!r}: {value!r} is not one of its labels "
                          f"({allowed})")

    def spellings(self, label_index: int) -> tuple[str, ...]:
        """JSON spellings of a label, canonical first (DESIGN.md §2 rule 5).

        Booleans: ``true`` and ``"true"``. Enums: the label as a JSON string with minimal
        escaping (quotes, backslashes, control characters; ``/`` and non-ASCII kept as is).
        """
        label = self.labels[label_index]
        if self.is_boolean:
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


def parse_example(schema_fields: tuple["Field", ...], data: Any, source: str) -> Example:
    """Validate one example ``{text: ..., labels: {field: value}}`` (or ``columns:`` for templates).

    Booleans may be given as JSON booleans or ``"true"``/``"false"``; enum values must be
    exact labels.

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
    indices = []
    for f in schema_fields:
        if f.name not in labels or labels[f.name] is None:
            raise SchemaError(f"{source}: field {f.name!r} has no value; an example must answer every field")
        indices.append(f.label_index(labels[f.name], where=source))
    return Example(labels=tuple(indices), text=text.strip() if text is not None else None,
                   columns=tuple((str(k), str(v)) for k, v in columns.items()) if columns is not None else None,
                   source=source)


@dataclass(frozen=True)
class Schema:
    """A validated schema: ordered fields and the waves they are decided in.

    Attributes:
        name: schema name (from the file, else the file stem).
        instructions: extra text for the prompt's system turn ('' if none).
        fields: fields in schema order (the order of the JSON object).
        waves: tuples of field indices; wave 0 is the first field alone (DESIGN.md §2 rule 8),
            later waves follow ``depends_on`` levels.
        warnings: soft problems found while validating.
        examples: few-shot examples from the schema's ``examples:`` key.
        source_sha256: sha256 of the canonical JSON form of the schema (for output metadata).
    """

    name: str
    instructions: str
    fields: tuple[Field, ...]
    waves: tuple[tuple[int, ...], ...]
    warnings: tuple[str, ...] = ()
    source_sha256: str = ""
    examples: tuple[Example, ...] = ()

    def field_index(self, name: str) -> int:
        for i, f in enumerate(self.fields):
            if f.name == name:
                return i
        raise KeyError(name)

    def check_output_columns(self, reserved: str) -> None:
        """Raise ``SchemaError`` if a field's output column would clash with ``reserved``
        (the id column, or ``__truncated``)."""
        for f in self.fields:
            if f.name == reserved:
                if reserved.startswith("__"):
                    raise SchemaError(f"field {f.name!r}: clashes with the output column {reserved!r}; rename the field")
                raise SchemaError(f"field {f.name!r}: clashes with the id column {reserved!r}; "
                                  "rename the field or pass another --id-field")


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
        SchemaError: unreadable file, or any validation problem (message names the field).
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
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text, object_pairs_hook=_unique_json_object)
        else:
            data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except _RepeatedKey as exc:
        raise SchemaError(f"schema file {str(path)!r}: {exc}; a name given twice is never resolved silently "
                          "(remove or rename one)") from None
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SchemaError(f"schema file {str(path)!r}: not valid {path.suffix.lstrip('.').upper() or 'YAML'}: {exc}") from exc
    return parse_schema(data, default_name=path.stem)


#: Keys a schema in pcd's own format may have at the top level, and in each field.
TOP_KEYS = ("name", "instructions", "fields", "examples")
FIELD_KEYS = ("type", "description", "labels", "choices", "depends_on")


def _check_keys(mapping: dict, known: tuple[str, ...], where: str) -> None:
    """Refuse a key pcd does not know (a typo like ``descripton`` would otherwise be ignored
    silently), naming it and the nearest known key.

    Raises:
        SchemaError: ``<where>: unknown key 'descripton' (did you mean 'description'?)``.
    """
    import difflib

    for key in mapping:
        if key not in known:
            near = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            hint = f"did you mean {near[0]!r}?" if near else f"known keys: {', '.join(known)}"
            raise SchemaError(f"{where}: unknown key {key!r} ({hint})")


def parse_schema(data: Any, *, default_name: str = "schema") -> Schema:
    """Validate a schema given as plain Python data (the parsed file).

    Raises:
        SchemaError: the first problem found, naming the field.
    """
    if not isinstance(data, dict):
        raise SchemaError("schema: expected a mapping with a 'fields' key at the top level")
    if "properties" in data and "fields" not in data:
        data = _from_json_schema(data)
    if "schema" in data and "fields" not in data and isinstance(data["schema"], dict):
        data = {"name": data.get("id", default_name), "fields": data["schema"]}  # preset files
    _check_keys(data, TOP_KEYS, "schema")
    raw_fields = data.get("fields")
    if raw_fields is None or (hasattr(raw_fields, "__len__") and len(raw_fields) == 0):
        raise SchemaError("schema: no fields; add at least one field under 'fields'")
    items = _field_items(raw_fields)
    fields: list[Field] = []
    warnings: list[str] = []
    seen: set[str] = set()
    for name, spec in items:
        f, warns = _parse_field(name, spec)
        if f.name in seen:
            raise SchemaError(f"field {f.name!r}: defined twice")
        seen.add(f.name)
        fields.append(f)
        warnings.extend(warns)
    names = {f.name for f in fields}
    for f in fields:
        for suffix in OUTPUT_SUFFIXES:
            if f.name.endswith(suffix) and f.name[: -len(suffix)] in names:
                raise SchemaError(
                    f"field {f.name!r}: clashes with the output column {f.name!r} of field "
                    f"{f.name[: -len(suffix)]!r}; rename it")
    waves = _waves(fields)
    name = data.get("name", default_name)
    instructions = data.get("instructions") or ""
    if not isinstance(name, str) or not isinstance(instructions, str):
        raise SchemaError("schema: 'name' and 'instructions' must be strings")
    raw_examples = data.get("examples") or []
    if not isinstance(raw_examples, list):
        raise SchemaError("schema: 'examples' must be a list of {text: ..., labels: {...}}")
    examples = tuple(parse_example(tuple(fields), ex, f"examples[{i}]") for i, ex in enumerate(raw_examples))
    canonical_data = {"name": name, "instructions": instructions,
                      "fields": [[f.name, f.type, f.description, list(f.labels), list(f.depends_on)] for f in fields]}
    if examples:  # schemas without examples keep the hash they had before examples existed
        canonical_data["examples"] = [[e.text, e.columns, list(e.labels)] for e in examples]
    canonical = json.dumps(canonical_data, ensure_ascii=False, sort_keys=True)
    return Schema(name=name, instructions=instructions.strip(), fields=tuple(fields),
                  waves=waves, warnings=tuple(warnings),
                  source_sha256=hashlib.sha256(canonical.encode()).hexdigest(), examples=examples)


def _field_items(raw_fields: Any) -> list[tuple[Any, Any]]:
    if isinstance(raw_fields, dict):
        return list(raw_fields.items())
    if isinstance(raw_fields, list):
        items = []
        for i, spec in enumerate(raw_fields):
            if not isinstance(spec, dict) or "name" not in spec:
                raise SchemaError(f"fields[{i}]: a list item needs a 'name' key")
            items.append((spec["name"], {k: v for k, v in spec.items() if k != "name"}))
        return items
    raise SchemaError("schema: 'fields' must be a mapping (name -> spec) or a list")


def _parse_field(name: Any, spec: Any) -> tuple[Field, list[str]]:
    if not isinstance(name, str) or not name.strip():
        hint = "; quote it in the schema file" if isinstance(name, (bool, int, float)) else ""
        raise SchemaError(f"field {name!r}: a field name must be a non-empty string{hint}")
    if not isinstance(spec, dict):
        raise SchemaError(f"field {name!r}: expected a mapping with 'type' (boolean or enum)")
    _check_keys(spec, FIELD_KEYS, f"field {name!r}")
    ftype = spec.get("type")
    if ftype in ("bool",):
        ftype = "boolean"
    if ftype not in FIELD_TYPES:
        raise SchemaError(f"field {name!r}: unknown type {ftype!r}; expected one of {', '.join(FIELD_TYPES)}")
    description = spec.get("description") or ""
    if not isinstance(description, str):
        raise SchemaError(f"field {name!r}: 'description' must be a string")
    depends_on = spec.get("depends_on") or []
    if isinstance(depends_on, str):
        depends_on = [depends_on]
    if not isinstance(depends_on, list) or not all(isinstance(d, str) for d in depends_on):
        raise SchemaError(f"field {name!r}: 'depends_on' must be a list of field names")
    raw_labels = spec.get("labels", spec.get("choices"))
    warnings: list[str] = []
    if ftype == "boolean":
        if raw_labels is not None:
            raise SchemaError(f"field {name!r}: a boolean takes no labels (its values are true and false); "
                              "use type: enum for named labels")
        labels: tuple[str, ...] = BOOLEAN_LABELS
    else:
        if not isinstance(raw_labels, list) or not raw_labels:
            raise SchemaError(f"field {name!r}: an enum needs a non-empty list of 'labels'")
        for i, label in enumerate(raw_labels):
            if not isinstance(label, str):
                raise SchemaError(
                    f"field {name!r}: label #{i + 1} is {label!r} ({type(label).__name__}), not a string; "
                    "quote it in the schema file")
            if label == "":
                raise SchemaError(f"field {name!r}: label #{i + 1} is empty")
            if not label.strip():
                raise SchemaError(f"field {name!r}: label #{i + 1} is only whitespace ({label!r}); the model cannot "
                                  "write it in a way that means anything; give it a name")
        if len(raw_labels) < 2:
            raise SchemaError(f"field {name!r}: an enum needs at least two labels, got {raw_labels!r}")
        exact: set[str] = set()
        folded: dict[str, str] = {}
        stripped: dict[str, str] = {}
        for label in raw_labels:
            if label in exact:
                raise SchemaError(f"field {name!r}: duplicate label {label!r}")
            exact.add(label)
            if stripped.setdefault(label.strip(), label) != label:
                raise SchemaError(f"field {name!r}: labels {stripped[label.strip()]!r} and {label!r} differ only by "
                                  "surrounding whitespace; the catalog shows them as the same word to the model, "
                                  "so keep one (or rename one)")
            if label != label.strip():
                warnings.append(f"field {name!r}: label {label!r} has surrounding whitespace; the model must write "
                                "it inside the quotes to pick this label (it is returned exactly as written); "
                                "remove it unless the downstream system needs it")
            key = label.casefold()
            if key in folded:
                warnings.append(f"field {name!r}: labels {folded[key]!r} and {label!r} differ only by case")
            folded.setdefault(key, label)
        labels = tuple(raw_labels)
    return Field(name=name, type=ftype, description=description.strip(), labels=labels,
                 depends_on=tuple(depends_on)), warnings


def _waves(fields: list[Field]) -> tuple[tuple[int, ...], ...]:
    """Decision waves: the first field alone, then ``depends_on`` levels (DESIGN.md §2 rule 8)."""
    index = {f.name: i for i, f in enumerate(fields)}
    for f in fields:
        for dep in f.depends_on:
            if dep not in index:
                raise SchemaError(f"field {f.name!r}: depends_on names an unknown field {dep!r}")
            if dep == f.name:
                raise SchemaError(f"field {f.name!r}: depends_on names the field itself")
    if fields[0].depends_on:
        raise SchemaError(f"field {fields[0].name!r}: the first field is decided first and cannot depend on others")
    level: dict[int, int] = {0: 0}
    visiting: set[int] = set()

    def level_of(i: int) -> int:
        if i in level:
            return level[i]
        if i in visiting:
            raise SchemaError(f"field {fields[i].name!r}: depends_on forms a cycle")
        visiting.add(i)
        deps = [level_of(index[d]) for d in fields[i].depends_on]
        visiting.discard(i)
        level[i] = 1 + max(deps, default=0)
        return level[i]

    for i in range(len(fields)):
        level_of(i)
    n_waves = max(level.values()) + 1
    return tuple(tuple(i for i in range(len(fields)) if level[i] == w) for w in range(n_waves)
                 if any(level[i] == w for i in range(len(fields))))


def _from_json_schema(data: dict) -> dict:
    """Convert a JSON Schema object (properties of type boolean or with enum) to pcd's format."""
    fields: dict[str, dict] = {}
    for name, prop in (data.get("properties") or {}).items():
        if not isinstance(prop, dict):
            raise SchemaError(f"field {name!r}: JSON Schema property must be an object")
        spec: dict[str, Any] = {"description": prop.get("description", "")}
        if "enum" in prop:
            spec.update(type="enum", labels=prop["enum"])
        elif prop.get("type") == "boolean":
            spec["type"] = "boolean"
        else:
            raise SchemaError(f"field {name!r}: only boolean properties and enum properties are supported, "
                              f"got {prop.get('type')!r}")
        fields[name] = spec
    return {"name": data.get("title", "schema"), "instructions": data.get("description", ""), "fields": fields}
