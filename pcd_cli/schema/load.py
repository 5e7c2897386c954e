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

  An optional ``rules:`` list holds rules between fields (``pcd_cli.schema.rules``), e.g.
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
from pathlib import Path
from typing import Any

import yaml

from ..errors import SchemaError
from .fields import check_keys, depends_problems, parse_field, raise_all
from .jsonschema import from_json_schema
from .model import (
    BOOLEAN_LABELS,
    DEFAULT_RECORD_QUOTING,
    JSON_TEXT,
    OUTPUT_SUFFIXES,
    RECORD_QUOTINGS,
    TOP_KEYS,
    Example,
    Field,
    Schema,
    decision_labels,
    type_options,
)
from .rules import parse_rules


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
    see ``pcd_cli.schema.pydantic``).

    Raises:
        SchemaError: unreadable file, or every validation problem at once (see ``parse_schema``).
    """
    if str(path).endswith(".py") or ".py:" in str(path):  # a Pydantic model: models.py:MyModel
        from .pydantic import load_model  # lazy: importing the user's module is for .py schemas only

        model, source = load_model(str(path))
        return schema_from_model(model, source=source)
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
    written: Any = JSON_TEXT
    if not is_json:
        try:
            written = yaml.load(text, Loader=yaml.BaseLoader)  # noqa: S506 - every scalar as the text written
        except yaml.YAMLError:  # only for messages: without it they show the values as read
            written = None
    return parse_schema(data, default_name=path.stem, source=str(path), written=written)


def schema_from_model(model: type, *, source: str = "") -> Schema:
    """A validated ``Schema`` from a Pydantic model class (``pcd_cli.schema.pydantic``).

    Raises:
        SchemaError: not a Pydantic model class, a field whose type pcd cannot read (named with
            its type), or any check ``parse_schema`` makes; every problem of the model at once
            (``source``, else the model's name, names it then).
    """
    from .pydantic import model_data  # lazy: start-up time only

    return parse_schema(model_data(model), default_name=model.__name__, source=source or model.__name__)


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
            written (``NO``, ``007``); ``JSON_TEXT`` for a JSON file; ``None``: plain data.

    Raises:
        SchemaError: the one problem found, or ``<source> has N problems:`` and one line each.
    """
    problems: list[str] = []
    if not isinstance(data, dict):
        raise SchemaError("schema: expected a mapping with a 'fields' key at the top level")
    warnings: list[str] = []
    if "properties" in data and "fields" not in data:
        data = from_json_schema(data, problems, warnings)
        written = JSON_TEXT if written is JSON_TEXT else None  # a JSON Schema in YAML: plain messages
    raw_fields_written = written.get("fields") if isinstance(written, dict) else None
    if "schema" in data and "fields" not in data and isinstance(data["schema"], dict):
        data = {"name": data.get("id", default_name), "fields": data["schema"]}  # preset files
        raw_fields_written = written.get("schema") if isinstance(written, dict) else None
    check_keys(data, TOP_KEYS, "schema", problems)
    raw_fields = data.get("fields")
    if raw_fields is None or (hasattr(raw_fields, "__len__") and len(raw_fields) == 0):
        if not any("(did you mean 'fields'?)" in p for p in problems):  # else that says it already
            problems.append("schema: no fields; add at least one field under 'fields'")
        raise_all(problems, source)

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
    isolate = data.get("isolate_fields", False)
    if not isinstance(isolate, bool):
        problems.append("schema: 'isolate_fields' must be true or false")
    elif isolate:
        problems.extend(isolation_problems(fields))
    quoting = data.get("record_quoting", DEFAULT_RECORD_QUOTING)
    if quoting not in RECORD_QUOTINGS:
        problems.append(f"schema: 'record_quoting' must be one of {', '.join(RECORD_QUOTINGS)}, got {quoting!r}")
    raw_examples = data.get("examples") or []
    if not isinstance(raw_examples, list):
        problems.append("schema: 'examples' must be a list of {text: ..., labels: {...}}")
    raise_all(problems, source)
    examples = []  # checked against sound fields only: an example of a broken field says nothing
    for i, ex in enumerate(raw_examples):
        try:
            examples.append(parse_example(tuple(fields), ex, f"examples[{i}]"))
        except SchemaError as exc:
            problems.append(str(exc))
    rules = parse_rules(data.get("rules"), tuple(fields), problems, warnings)  # against sound fields, like examples
    raise_all(problems, source)
    canonical_data = {"name": name, "instructions": instructions,
                      "fields": [[f.name, f.type, f.description, list(f.labels), list(f.depends_on)]
                                 + ([type_options(f)] if type_options(f) else []) for f in fields]}
    if examples:  # schemas without examples keep the hash they had before examples existed
        canonical_data["examples"] = [[e.text, e.columns, list(e.labels)] for e in examples]
    if rules:  # likewise for rules
        canonical_data["rules"] = [r.to_dict() for r in rules]
    if isolate is True:  # likewise for isolation
        canonical_data["isolate_fields"] = True
    if quoting != "json":  # likewise for the record's quoting (json: the hash of before quoting existed)
        canonical_data["record_quoting"] = quoting
    canonical = json.dumps(canonical_data, ensure_ascii=False, sort_keys=True)
    decisions, parts = _expand(fields)
    return Schema(name=name, instructions=instructions.strip(), fields=decisions,
                  waves=tuple(tuple(d for fi in wave for d in parts[fi]) for wave in waves), warnings=tuple(warnings),
                  source_sha256=hashlib.sha256(canonical.encode()).hexdigest(), examples=tuple(examples),
                  declared=tuple(fields), parts=parts, rules=rules, isolate_fields=isolate is True,
                  record_quoting=quoting)


def isolation_problems(fields) -> list[str]:
    """Why ``fields`` cannot be decided in isolation (``isolate_fields``): a ``depends_on`` field
    sees another field's answer by definition."""
    return [f"field {f.name!r}: depends_on {list(f.depends_on)} cannot hold with isolate_fields (an isolated "
            "field sees no other field's answer); drop one of them" for f in fields if f.depends_on]


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
    place; ``JSON_TEXT`` / ``None`` as ``written`` says when there is no such text."""
    if written is None or written is JSON_TEXT:
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


def _waves(fields: list[Field], problems: list[str], *, checked: bool = False,
           first_read: bool = True) -> tuple[tuple[int, ...], ...]:
    """Decision waves: the first field alone, then ``depends_on`` levels (docs/how-it-works.md, decoding rule 8).

    Cycles are appended to ``problems`` (each once); so are unknown names, a field naming
    itself and a first field that depends, unless ``checked`` (``fields.parse_field`` did). A
    dependency on a field not in ``fields`` (one that could not be read) is skipped;
    ``first_read``: ``fields[0]`` is the schema's first field (else it is walked like the rest).
    """
    index = {f.name: i for i, f in enumerate(fields)}
    deps: dict[int, list[int]] = {}
    for i, f in enumerate(fields):
        if not checked:
            problems.extend(depends_problems(f.name, list(f.depends_on), set(index), i == 0))
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
