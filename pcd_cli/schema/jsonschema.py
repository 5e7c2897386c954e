"""JSON Schema files as tools write them (pydantic's ``model_json_schema()``, hand-written
files) -> pcd's schema format, for ``pcd_cli.schema.load.parse_schema``.

Accepted properties (JSON Schema 2020-12, https://json-schema.org/draft/2020-12/json-schema-core):

* ``type: boolean`` -> boolean; ``enum`` of strings, or an ``anyOf``/``oneOf`` made only of
  ``const``/``enum`` parts -> enum (``"x-pcd-type": "ordinal"`` beside it: ordinal, labels in
  order, lowest first; ``"x-pcd-none-label": NAME``: ``none_label``, taken out of the enum
  when it lists it);
* ``type: integer`` with both bounds (``minimum``/``maximum``, or ``exclusiveMinimum``/
  ``exclusiveMaximum``, numbers or the draft-04 booleans) -> integer;
* ``type: array`` whose ``items`` are an enum (or a union of consts) -> multi
  (``minItems``/``maxItems`` -> ``min_items``/``max_items``, ``"x-pcd-threshold"`` ->
  ``threshold``; ``uniqueItems`` may be given or not);
* a null part -> ``nullable: true``: an ``anyOf``/``oneOf`` with ``{"type": "null"}`` (what
  ``Optional[...]`` writes) beside one part or beside consts/enums, an ``enum`` listing
  ``null``, ``"type": [..., "null"]``;
* local ``$ref`` into ``#/$defs`` or ``#/definitions`` (chains too), ``allOf`` of a single
  part, ``description``/``title``, ``depends_on`` (as Pydantic's ``json_schema_extra`` writes it).

Anything else (free text, decimal numbers, an integer without both bounds, a list of
anything but enum items, nested objects, non-local or cyclic references) is an ``Unparsed``
field whose message names the field and the construct.
"""

from __future__ import annotations

import math
from typing import Any

from .model import MAX_INTEGER_VALUES, Unparsed


class _NotExpressible(Exception):
    """A JSON Schema construct pcd cannot express (the message names the field and the construct)."""


#: JSON Schema types pcd cannot express (as a field, or as the items of a list), for messages.
_JS_TYPES = {"string": "free text", "number": "a decimal number", "object": "a nested object",
             "null": "no value", "array": "a list", "integer": "a whole number", "boolean": "a boolean"}
#: The items of a list pcd cannot read as a multi-select, for messages.
_ITEMS = {"string": "free text", "number": "decimal numbers", "integer": "whole numbers", "boolean": "booleans",
          "object": "nested objects", "array": "lists", "null": "nulls"}
#: What pcd reads, for messages refusing a construct.
KINDS = ("pcd fields are boolean, enum (ordinal with x-pcd-type), integer with minimum and maximum, "
         "or an array of enum items (multi-select)")
#: Extension keys on a property (``json_schema_extra`` on a Pydantic field): the ordinal type,
#: a multi field's threshold, an enum's none label.
TYPE_KEY, THRESHOLD_KEY, NONE_LABEL_KEY = "x-pcd-type", "x-pcd-threshold", "x-pcd-none-label"


#: Top-level extension key holding rules between fields (``pcd_cli.schema.rules``) in a JSON Schema.
RULES_KEY = "x-pcd-rules"


def from_json_schema(data: dict, problems: list[str], warnings: list[str]) -> dict:
    """Convert a JSON Schema object to pcd's format: each property becomes a field (see the
    module docstring for what is read).

    Local ``$ref`` (``#/$defs/...``, ``#/definitions/...``, chains of them) and an ``allOf``
    of a single part are followed; ``description`` (else a ``title`` that says more than the
    name) at the property, else at the target, becomes the field's description. A property
    pcd cannot express becomes an ``Unparsed`` field naming the construct. A top-level
    ``"x-pcd-rules"`` list becomes the schema's ``rules``.
    """
    properties = data.get("properties")
    if not isinstance(properties, dict):
        problems.append("schema: JSON Schema 'properties' must be an object (property name -> schema)")
        properties = {}
    fields: dict[str, Any] = {}
    for name, prop in properties.items():
        try:
            fields[name] = _json_property(name, prop, data, warnings)
        except _NotExpressible as exc:
            fields[name] = Unparsed([str(exc)])
    out = {"name": data.get("title", "schema"), "instructions": data.get("description", ""), "fields": fields}
    if RULES_KEY in data:  # rules between fields (pcd_cli.schema.rules), as an extension key
        out["rules"] = data[RULES_KEY]
    return out


def _json_property(name: str, prop: Any, root: dict, warnings: list[str]) -> dict:
    if not isinstance(prop, dict):
        raise _NotExpressible(f"field {name!r}: JSON Schema property must be an object")
    node, description = _json_resolve(name, prop, root, (), name)
    spec: dict[str, Any] = {"description": description}
    spec.update(_json_decision(name, node, root, warnings))
    problem = apply_extensions(f"field {name!r}", node, spec)
    if problem:
        raise _NotExpressible(problem)
    if "depends_on" in node:  # what a Pydantic json_schema_extra={"depends_on": [...]} writes
        spec["depends_on"] = node["depends_on"]
    return spec


def apply_extensions(where: str, keys: dict, spec: dict) -> str | None:
    """Apply the ``x-pcd-*`` keys of a property (or of a Pydantic field's ``json_schema_extra``)
    to the field ``spec``: ``x-pcd-type: ordinal`` on an enum, ``x-pcd-threshold`` (a multi
    field's), ``x-pcd-none-label`` (an enum's or ordinal's: when the enum lists it, it is taken
    out of the labels, as pcd appends it last). Returns the problem, or ``None``."""
    kind = keys.get(TYPE_KEY)
    if kind is not None:
        if kind != "ordinal":
            return f"{where}: {TYPE_KEY} {kind!r} is not supported; the one value is 'ordinal' (on an enum)"
        if spec.get("type") != "enum":
            return (f"{where}: {TYPE_KEY} 'ordinal' applies to an enum (its labels in order, lowest first), "
                    f"not to a {spec.get('type')}")
        spec["type"] = "ordinal"
    if THRESHOLD_KEY in keys:
        spec["threshold"] = keys[THRESHOLD_KEY]
    if NONE_LABEL_KEY in keys:
        none_label = keys[NONE_LABEL_KEY]
        spec["none_label"] = none_label
        labels = spec.get("labels")
        if isinstance(labels, list) and isinstance(none_label, str) and none_label in labels:
            spec["labels"] = [label for label in labels if label != none_label]
    return None


def typed_choice(where: str, values: list, construct: str) -> dict:
    """The field spec of a closed set of values, keeping their JSON type: strings -> an enum;
    ``true`` and ``false`` -> a boolean; whole numbers forming a contiguous range (``[1, 2,
    3]``, an ``IntEnum``, ``Literal[1, 2, 3]``) -> an integer field ``minimum..maximum``, whose
    output column holds integers. Shared by JSON Schema ``enum``/``const`` unions and Pydantic
    ``Literal``/``Enum`` types, so a model and its ``model_json_schema()`` give the same field.

    Other mixes are left as an enum of the raw values (the label check names each non-string).

    Raises:
        ValueError: whole numbers with gaps (``[0, 5, 10, 25]``) or a single boolean; the message
            starts with ``where``, names ``construct`` and gives a fix that keeps the types, or
            says plainly that the output would be strings.
    """
    if values and all(isinstance(v, bool) for v in values):
        if set(values) == {True, False}:
            return {"type": "boolean"}
        raise ValueError(f"{where}: {construct} allows only {values[0]!r}, one fixed value, which is not a decision; "
                         "use bool (true or false), or drop the field")
    if len(values) >= 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        lo, hi = min(values), max(values)
        if len(set(values)) == hi - lo + 1 and hi - lo + 1 <= MAX_INTEGER_VALUES:
            return {"type": "integer", "minimum": lo, "maximum": hi}
        shown = ", ".join(map(str, sorted(set(values))))
        quoted = ", ".join(repr(str(v)) for v in sorted(set(values)))
        raise ValueError(f"{where}: {construct} lists whole numbers with gaps ({shown}); an integer field reads "
                         f"every whole number from its lower to its upper bound: to keep integers in the output, "
                         f"allow the range, Annotated[int, Field(ge={lo}, le={hi})] (JSON Schema: \"minimum\": {lo}, "
                         f"\"maximum\": {hi}); or make the values labels, Literal[{quoted}], and the output column "
                         "holds strings ('5', not 5)")
    return {"type": "enum", "labels": list(values)}


def _json_decision(name: str, node: dict, root: dict, warnings: list[str]) -> dict:
    """The field spec (type, labels or bounds, ``nullable``) of a resolved property node."""
    ftype = node.get("type")
    nullable = False
    if isinstance(ftype, list):
        nullable = "null" in ftype
        rest = [t for t in ftype if t != "null"]
        if len(rest) > 1:
            raise _NotExpressible(f"field {name!r}: type {ftype!r} (a union of types) is not supported; {KINDS}")
        ftype = rest[0] if rest else "null"
    spec: dict[str, Any]
    union = next((key for key in ("anyOf", "oneOf") if key in node), None)
    if union:
        spec = _json_union(name, union, node[union], root, warnings)
    elif "enum" in node:
        values = node["enum"]
        if isinstance(values, list) and None in values:  # Optional[...] written as an enum with null
            nullable = True
            values = [v for v in values if v is not None]
        spec = _typed(name, values, "enum") if isinstance(values, list) else {"type": "enum", "labels": values}
    elif "const" in node:
        raise _NotExpressible(f"field {name!r}: const {node['const']!r} (one fixed value) is not a decision; "
                              "give at least two labels with enum, or drop the field")
    elif ftype == "boolean":
        spec = {"type": "boolean"}
    elif ftype == "integer":
        spec = _json_integer(name, node)
    elif ftype == "array":
        spec = _json_array(name, node, root, warnings)
    elif ftype == "string":
        raise _NotExpressible(f"field {name!r}: type 'string' without enum (free text) is not supported; "
                              f"{KINDS}: list the labels with enum")
    elif ftype == "number":
        raise _NotExpressible(f"field {name!r}: type 'number' (a decimal number) is not supported; use type "
                              "'integer' with minimum and maximum, or list the values with enum")
    elif ftype == "null":
        raise _NotExpressible(f"field {name!r}: type 'null' (always no value) is not a decision; {KINDS}")
    elif ftype in _JS_TYPES:
        raise _NotExpressible(f"field {name!r}: type {ftype!r} ({_JS_TYPES[ftype]}) is not supported; {KINDS}")
    elif ftype is not None:
        raise _NotExpressible(f"field {name!r}: unknown JSON Schema type {ftype!r}; {KINDS}")
    else:
        constructs = sorted(k for k in ("allOf", "not", "if", "properties", "items", "patternProperties") if k in node)
        if constructs:
            raise _NotExpressible(f"field {name!r}: {constructs[0]} is not supported; {KINDS}")
        raise _NotExpressible(f"field {name!r}: a property with no type, enum or $ref (any value) is not supported; "
                              f"{KINDS}")
    if nullable:
        spec["nullable"] = True
    return spec


def integer_bounds(minimum: Any = None, exclusive_minimum: Any = None, maximum: Any = None,
                   exclusive_maximum: Any = None) -> tuple[int | None, int | None]:
    """The smallest and largest whole numbers within the bounds given (``None`` where no bound
    is given on that side): ``minimum`` 1.5 gives 2, ``exclusiveMinimum`` 0 gives 1; the
    draft-04 form (``exclusiveMinimum: true`` beside ``minimum``) too.

    Raises:
        ValueError: a bound that is not a finite number (the message names it).
    """
    def number(key: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{key!r} of an integer must be a number, got {value!r}")
        return value

    lows, highs = [], []
    if exclusive_minimum is True and minimum is not None:  # draft-04: minimum is exclusive
        minimum, exclusive_minimum = None, minimum
    if exclusive_maximum is True and maximum is not None:
        maximum, exclusive_maximum = None, maximum
    if minimum is not None:
        lows.append(math.ceil(number("minimum", minimum)))
    if exclusive_minimum is not None and exclusive_minimum is not False:
        lows.append(math.floor(number("exclusiveMinimum", exclusive_minimum)) + 1)
    if maximum is not None:
        highs.append(math.floor(number("maximum", maximum)))
    if exclusive_maximum is not None and exclusive_maximum is not False:
        highs.append(math.ceil(number("exclusiveMaximum", exclusive_maximum)) - 1)
    return (max(lows) if lows else None), (min(highs) if highs else None)


def _json_integer(name: str, node: dict) -> dict:
    """``type: integer`` with both bounds -> an integer field ``minimum..maximum``."""
    if "multipleOf" in node:
        raise _NotExpressible(f"field {name!r}: multipleOf on an integer is not supported; pcd reads every whole "
                              "number from minimum to maximum: drop multipleOf, or list the values with enum")
    try:
        lo, hi = integer_bounds(node.get("minimum"), node.get("exclusiveMinimum"), node.get("maximum"),
                                node.get("exclusiveMaximum"))
    except ValueError as exc:
        raise _NotExpressible(f"field {name!r}: {exc}") from None
    if lo is None or hi is None:
        missing = " or ".join(side for side, v in (("lower", lo), ("upper", hi)) if v is None)
        raise _NotExpressible(f"field {name!r}: type 'integer' without both bounds (no {missing} bound) is not "
                              "supported; pcd reads an "
                              "integer as one of its values: give minimum (or exclusiveMinimum) and maximum "
                              f"(or exclusiveMaximum), at most {MAX_INTEGER_VALUES} values")
    return {"type": "integer", "minimum": lo, "maximum": hi}


def _json_array(name: str, node: dict, root: dict, warnings: list[str]) -> dict:
    """``type: array`` whose items are an enum (or a union of consts) -> a multi field;
    ``minItems``/``maxItems`` -> ``min_items``/``max_items``."""
    items = node.get("items")
    fix = "a multi-select is an array whose items are an enum of strings (list[Literal[...]], set[MyEnum])"
    if not isinstance(items, dict):
        shown = "prefixItems (a tuple)" if "prefixItems" in node else "no items schema (a list of anything)"
        raise _NotExpressible(f"field {name!r}: type 'array' with {shown} is not supported; {fix}")
    item, _ = _json_resolve(name, items, root, (), name)
    if not any(k in item for k in ("enum", "anyOf", "oneOf")):
        kind = item.get("type")
        shown = (_ITEMS.get(kind, f"items of type {kind!r}") if isinstance(kind, str) else
                 "const items" if "const" in item else "items of any value")
        raise _NotExpressible(f"field {name!r}: type 'array' of {shown} is not supported; {fix}")
    labels = _json_decision(name, item, root, warnings)
    if labels.get("type") != "enum":
        shown = "whole numbers" if labels.get("type") == "integer" else "booleans"
        raise _NotExpressible(f"field {name!r}: type 'array' of {shown} is not supported; {fix}")
    if labels.get("nullable"):
        raise _NotExpressible(f"field {name!r}: type 'array' of items that may be null is not supported; {fix}")
    spec: dict[str, Any] = {"type": "multi", "labels": labels["labels"]}
    for key, ours in (("minItems", "min_items"), ("maxItems", "max_items")):
        if key in node:
            spec[ours] = node[key]
    return spec


def _json_resolve(name: str, node: dict, root: dict, chain: tuple[str, ...],
                  own_name: str) -> tuple[dict, str]:
    """Follow ``$ref`` and single-part ``allOf`` from ``node``: the merged node (the referring
    node's keys over the target's) and the description (nearest to the property wins)."""
    description = _json_description(node, own_name)
    if "$ref" in node:
        ref = node["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#/"):
            raise _NotExpressible(f"field {name!r}: $ref {ref!r} is not a local reference; pcd follows only "
                                  "references into the same file ('#/$defs/...', '#/definitions/...'): "
                                  "inline the definition")
        if ref in chain:
            loop = " -> ".join(repr(r) for r in (*chain[chain.index(ref):], ref))
            raise _NotExpressible(f"field {name!r}: $ref {ref!r} forms a cycle ({loop})")
        target = _json_pointer(root, ref)
        if not isinstance(target, dict):
            raise _NotExpressible(f"field {name!r}: $ref {ref!r} points to nothing in this file"
                                  if target is None else f"field {name!r}: $ref {ref!r} points to a "
                                  f"{type(target).__name__}, not a schema object")
        inner, inner_description = _json_resolve(name, target, root, (*chain, ref), ref.rsplit("/", 1)[-1])
        rest = {k: v for k, v in node.items() if k != "$ref"}
        merged, merged_description = _json_resolve(name, rest, root, chain, own_name) if "allOf" in rest \
            else (rest, description)
        return {**inner, **merged}, merged_description or inner_description
    parts = node.get("allOf")
    if parts is not None:
        if not isinstance(parts, list) or len(parts) != 1 or not isinstance(parts[0], dict):
            count = len(parts) if isinstance(parts, list) else parts
            raise _NotExpressible(f"field {name!r}: allOf with {count} parts is not supported; pcd follows "
                                  "allOf only with a single part (as pydantic writes a described $ref)")
        inner, inner_description = _json_resolve(name, parts[0], root, chain, own_name)
        rest = {k: v for k, v in node.items() if k != "allOf"}
        return {**inner, **rest}, description or inner_description
    return node, description


def _json_description(node: dict, own_name: str) -> str:
    """``description``, else a ``title`` that is more than the name re-spelled (pydantic
    titles every property ``Mentions Price`` and every definition with its class name)."""
    description = node.get("description")
    if description is not None and description != "":
        return description  # a non-string is reported by the field check
    title = node.get("title")

    def squash(text: str) -> str:
        return "".join(ch for ch in text.casefold() if ch.isalnum())

    if isinstance(title, str) and title.strip() and squash(title) != squash(own_name):
        return title
    return ""


def _json_pointer(root: dict, ref: str) -> Any:
    """The value at JSON pointer ``ref`` (``#/$defs/Name``) in ``root``, or ``None``."""
    from urllib.parse import unquote

    node: Any = root
    for part in ref[2:].split("/"):
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _is_null(node: dict) -> bool:
    """A union part that only allows null: ``{"type": "null"}``, ``{"const": null}``, ``{"enum": [null]}``."""
    return node.get("type") == "null" or ("const" in node and node["const"] is None) or node.get("enum") == [None]


def _json_union(name: str, key: str, branches: Any, root: dict, warnings: list[str]) -> dict:
    """The field spec of an ``anyOf``/``oneOf``: its null parts make the field nullable
    (``Optional[...]``); the rest is one part (read as a property: boolean, integer, enum,
    array) or parts that are each a ``const`` or an ``enum`` (the labels, in order)."""
    if not isinstance(branches, list) or not branches:
        raise _NotExpressible(f"field {name!r}: {key} must be a non-empty list")
    nodes = []
    for branch in branches:
        if not isinstance(branch, dict):
            raise _NotExpressible(f"field {name!r}: {key} has a part that is not an object")
        nodes.append(_json_resolve(name, branch, root, (), name)[0])
    rest = [node for node in nodes if not _is_null(node)]
    nullable = len(rest) < len(nodes)
    if not rest:
        raise _NotExpressible(f"field {name!r}: {key} of null parts only (always no value) is not a decision")
    if len(rest) == 1 and "const" not in rest[0]:
        spec = _json_decision(name, rest[0], root, warnings)
        if nullable:
            spec["nullable"] = True
        return spec
    labels: list = []
    described = False
    for node in rest:
        if "const" in node:
            labels.append(node["const"])
            label_text = node["const"] if isinstance(node["const"], str) else ""
            described = described or bool(_json_description(node, label_text))
        elif isinstance(node.get("enum"), list):
            nullable = nullable or None in node["enum"]
            labels.extend(v for v in node["enum"] if v is not None)
        elif all(part.get("type") == "object" or "properties" in part for part in rest):
            raise _NotExpressible(f"field {name!r}: {key} of objects (a union of objects, such as a discriminated "
                                  "union) is not supported; pcd labels flat fields: give each choice's fields a "
                                  "property of their own, e.g. an enum for the kind and Optional fields for the rest")
        else:
            shown = node.get("type") or next((k for k in ("anyOf", "oneOf", "allOf") if k in node), None)
            part = f"a {shown!r} part" if isinstance(shown, str) else "a part with no type, const or enum"
            raise _NotExpressible(f"field {name!r}: {key} with {part} (a union of types) is not supported; "
                                  "pcd reads anyOf/oneOf when every part is a const or an enum, or when one "
                                  "part is left beside null parts (Optional[...])")
    if described:
        warnings.append(f"field {name!r}: the titles and descriptions of its {key} labels are not shown to the "
                        "model (pcd's catalog lists the labels only); put what matters in the field's description")
    spec = _typed(name, labels, key)
    if nullable:
        spec["nullable"] = True
    return spec


def _typed(name: str, values: list, construct: str) -> dict:
    """``typed_choice`` for a JSON property (its problem as ``_NotExpressible``)."""
    try:
        return typed_choice(f"field {name!r}", values, construct)
    except ValueError as exc:
        raise _NotExpressible(str(exc)) from None
