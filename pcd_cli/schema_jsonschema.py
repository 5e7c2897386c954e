"""JSON Schema files as tools write them (pydantic's ``model_json_schema()``, hand-written
files) -> pcd's schema format, for ``pcd_cli.schema.parse_schema``.

Accepted: properties of ``type: boolean``; ``enum`` of strings; an ``anyOf``/``oneOf`` made
only of ``const``/``enum`` parts; local ``$ref`` into ``#/$defs`` or ``#/definitions``
(chains too); ``allOf`` of a single part; ``description``/``title``. Anything else (free
text, numbers, lists, nested objects, a ``null`` branch, non-local or cyclic references) is
an ``Unparsed`` field whose message names the field and the construct (JSON Schema 2020-12,
https://json-schema.org/draft/2020-12/json-schema-core).
"""

from __future__ import annotations

from typing import Any

from .schema import Unparsed


class _NotExpressible(Exception):
    """A JSON Schema construct pcd cannot express (the message names the field and the construct)."""


#: JSON Schema types pcd cannot express, and what they are, for messages.
_JS_TYPES = {"string": "free text", "integer": "a number", "number": "a number", "array": "a list",
             "object": "a nested object", "null": "no value"}
_NULL_FIX = "is not supported yet: pcd has no null label; make the field required"


def from_json_schema(data: dict, problems: list[str], warnings: list[str]) -> dict:
    """Convert a JSON Schema object to pcd's format: each property of type ``boolean``, or with
    ``enum`` (or an ``anyOf``/``oneOf`` of ``const``/``enum`` parts), becomes a field.

    Local ``$ref`` (``#/$defs/...``, ``#/definitions/...``, chains of them) and an ``allOf``
    of a single part are followed; ``description`` (else a ``title`` that says more than the
    name) at the property, else at the target, becomes the field's description. A property
    pcd cannot express becomes an ``Unparsed`` field naming the construct.
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
    return {"name": data.get("title", "schema"), "instructions": data.get("description", ""), "fields": fields}


def _json_property(name: str, prop: Any, root: dict, warnings: list[str]) -> dict:
    if not isinstance(prop, dict):
        raise _NotExpressible(f"field {name!r}: JSON Schema property must be an object")
    node, description = _json_resolve(name, prop, root, (), name)
    spec: dict[str, Any] = {"description": description}
    ftype = node.get("type")
    if isinstance(ftype, list) and "null" in ftype:
        raise _NotExpressible(f"field {name!r}: type {ftype!r} with 'null' (Optional[...]) {_NULL_FIX}")
    for key in ("anyOf", "oneOf"):
        if key in node:
            spec.update(type="enum", labels=_json_union(name, key, node[key], root, warnings))
            return spec
    if "enum" in node:
        values = node["enum"]
        if isinstance(values, list) and None in values:
            raise _NotExpressible(f"field {name!r}: enum with a null value (Optional[...]) {_NULL_FIX}")
        spec.update(type="enum", labels=values)
        return spec
    if "const" in node:
        raise _NotExpressible(f"field {name!r}: const {node['const']!r} (one fixed value) is not a decision; "
                              "give at least two labels with enum, or drop the field")
    if isinstance(ftype, list):
        if len(ftype) != 1:
            raise _NotExpressible(f"field {name!r}: type {ftype!r} (a union of types) is not supported; "
                                  "pcd fields are boolean or enum")
        ftype = ftype[0]
    if ftype == "boolean":
        spec["type"] = "boolean"
        return spec
    if ftype == "string":
        raise _NotExpressible(f"field {name!r}: type 'string' without enum (free text) is not supported; "
                              "pcd fields are boolean or enum: list the labels with enum")
    if ftype in _JS_TYPES:
        raise _NotExpressible(f"field {name!r}: type {ftype!r} ({_JS_TYPES[ftype]}) is not supported; "
                              "pcd fields are boolean or enum")
    if ftype is not None:
        raise _NotExpressible(f"field {name!r}: unknown JSON Schema type {ftype!r}; pcd fields are boolean or enum")
    constructs = sorted(k for k in ("allOf", "not", "if", "properties", "items", "patternProperties") if k in node)
    if constructs:
        raise _NotExpressible(f"field {name!r}: {constructs[0]} is not supported; pcd fields are boolean or enum")
    raise _NotExpressible(f"field {name!r}: a property with no type, enum or $ref (any value) is not supported; "
                          "pcd fields are boolean or enum")


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


def _json_union(name: str, key: str, branches: Any, root: dict, warnings: list[str]) -> list:
    """The labels of an ``anyOf``/``oneOf`` whose parts are each a ``const`` or an ``enum``."""
    if not isinstance(branches, list) or not branches:
        raise _NotExpressible(f"field {name!r}: {key} must be a non-empty list")
    nodes = []
    for branch in branches:
        if not isinstance(branch, dict):
            raise _NotExpressible(f"field {name!r}: {key} has a part that is not an object")
        nodes.append(_json_resolve(name, branch, root, (), name)[0])
    for node in nodes:  # Optional[...] is named as such, whatever the other parts are
        kind = node.get("type")
        if kind == "null" or (isinstance(kind, list) and "null" in kind) or node.get("const", 0) is None \
                or (isinstance(node.get("enum"), list) and None in node["enum"]):
            raise _NotExpressible(f"field {name!r}: {key} with a null branch (Optional[...]) {_NULL_FIX}")
    labels: list = []
    described = False
    for node in nodes:
        if "const" in node:
            labels.append(node["const"])
            label_text = node["const"] if isinstance(node["const"], str) else ""
            described = described or bool(_json_description(node, label_text))
        elif isinstance(node.get("enum"), list):
            labels.extend(node["enum"])
        else:
            shown = node.get("type") or next((k for k in ("anyOf", "oneOf", "allOf") if k in node), None)
            part = f"a {shown!r} part" if isinstance(shown, str) else "a part with no type, const or enum"
            raise _NotExpressible(f"field {name!r}: {key} with {part} (a union of types) is not supported; "
                                  "pcd reads anyOf/oneOf only when every part is a const or an enum")
    if described:
        warnings.append(f"field {name!r}: the titles and descriptions of its {key} labels are not shown to the "
                        "model (pcd's catalog lists the labels only); put what matters in the field's description")
    return labels
