"""One field of a schema file -> a validated ``Field``, or every problem it has.

Split from ``pcd_cli.schema.model`` (which reads whole files, checks names across fields and
builds the waves): here are the per-field rules, the type-specific keys (``ordinal``,
``integer``, ``nullable``, ``none_label``, ``multi``'s ``threshold``/``min_items``/
``max_items``) and the messages for labels YAML turned into booleans, numbers or dates.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import SchemaError
from .model import (
    BOOLEAN_LABELS,
    FIELD_KEYS,
    FIELD_TYPES,
    JSON_TEXT,
    MAX_INTEGER_VALUES,
    MAX_MULTI_OPTIONS,
    NULL_LABEL,
    Field,
    Unparsed,
    json_string,
)


def _as_read(value: Any) -> str:
    """What YAML (or JSON) made of a scalar: ``the boolean False``, ``the number 7``."""
    import datetime

    if isinstance(value, bool):
        return f"the boolean {value}"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if value is None:
        return "null (no value)"
    if isinstance(value, (datetime.date, datetime.datetime)):
        return f"the date {value}"
    return f"{value!r} ({type(value).__name__})"


def _not_text_label(name: str, number: int, label: Any, written: Any) -> str:
    """The message for label #``number`` of field ``name`` that is not a string."""
    if written is JSON_TEXT and (label is None or isinstance(label, (bool, int, float))):
        text = json.dumps(label)
        return f"field {name!r}: label #{number} is {_as_read(label)}, not a string; quote it: {json_string(text)}"
    if isinstance(written, str) and not isinstance(label, (list, dict)):
        if not written.strip():
            return f"field {name!r}: label #{number} is empty"
        return (f"field {name!r}: label #{number} is written {written}, which YAML reads as {_as_read(label)}, "
                f"not as text; quote it: {json_string(written)}")
    return (f"field {name!r}: label #{number} is {label!r} ({type(label).__name__}), not a string; "
            "quote it in the schema file")


def parse_field(name: Any, spec: Any, problems: list[str], written: Any = None, *, name_written: Any = None,
                 all_names: set[str] | None = None, first: bool = False) -> tuple[Field | None, list[str]]:
    """One field, or ``None`` with its problems (all of them) appended to ``problems``.

    ``written``/``name_written``: the spec and name as written (see ``parse_schema``);
    ``all_names``: every field's name, for ``depends_on``; ``first``: it is the first field.
    """
    if isinstance(spec, Unparsed):
        problems.extend(spec.problems)
        return None, []
    if not isinstance(name, str) or not name.strip():
        if isinstance(name_written, str) and name_written.strip() and name is not None \
                and not isinstance(name, (list, dict)):
            problems.append(f"field name {name_written} is read by YAML as {_as_read(name)}, not as text; "
                            f"quote it: {json_string(name_written)}")
            return None, []
        hint = "; quote it in the schema file" if isinstance(name, (bool, int, float)) else ""
        problems.append(f"field {name!r}: a field name must be a non-empty string{hint}")
        return None, []
    if not isinstance(spec, dict):
        problems.append(f"field {name!r}: expected a mapping with 'type' (boolean or enum)")
        return None, []
    found: list[str] = []
    check_keys(spec, FIELD_KEYS, f"field {name!r}", found)
    ftype = spec.get("type")
    if ftype in ("bool",):
        ftype = "boolean"
    if ftype not in FIELD_TYPES:
        found.append(f"field {name!r}: unknown type {ftype!r}; expected one of {', '.join(FIELD_TYPES)}")
    description = spec.get("description") or ""
    if not isinstance(description, str):
        found.append(f"field {name!r}: 'description' must be a string")
    depends_on = spec.get("depends_on") or []
    if isinstance(depends_on, str):
        depends_on = [depends_on]
    if not isinstance(depends_on, list) or not all(isinstance(d, str) for d in depends_on):
        found.append(f"field {name!r}: 'depends_on' must be a list of field names")
    else:
        found.extend(depends_problems(name, depends_on, all_names if all_names is not None else {name}, first))
    abstain_below = spec.get("abstain_below")
    if abstain_below is not None and (isinstance(abstain_below, bool) or not isinstance(abstain_below, (int, float))
                                      or not 0 < abstain_below < 1):
        found.append(f"field {name!r}: 'abstain_below' must be a probability between 0 and 1 (exclusive), "
                     f"got {abstain_below!r}")
    raw_labels = spec.get("labels", spec.get("choices"))
    warnings: list[str] = []
    labels: tuple[str, ...] = BOOLEAN_LABELS
    if ftype == "boolean":
        if raw_labels is not None:
            found.append(f"field {name!r}: a boolean takes no labels (its values are true and false); "
                         "use type: enum for named labels")
    elif ftype == "integer":
        labels = _integer_labels(name, spec, raw_labels, found)
    elif ftype in ("enum", "ordinal", "multi"):
        if not isinstance(raw_labels, list) or not raw_labels:
            found.append(f"field {name!r}: {'a' if ftype == 'multi' else 'an'} {ftype} needs a non-empty list of "
                         f"'labels'{' (its options)' if ftype == 'multi' else ''}")
        else:
            written_labels = None
            if isinstance(written, dict):
                written_labels = written.get("labels", written.get("choices"))
            elif written is JSON_TEXT:
                written_labels = [JSON_TEXT] * len(raw_labels)
            if not isinstance(written_labels, list) or len(written_labels) != len(raw_labels):
                written_labels = [None] * len(raw_labels)
            labels = tuple(raw_labels)
            found.extend(_label_problems(name, raw_labels, written_labels, warnings, kind=ftype))
    options = _type_option_values(name, ftype, spec, labels, found)
    if found:
        problems.extend(found)
        return None, []
    if options.get("none_label") is not None:
        labels = labels + (options["none_label"],)
    if options.get("nullable"):
        labels = labels + (NULL_LABEL,)
    return Field(name=name, type=ftype, description=description.strip(), labels=labels,
                 depends_on=tuple(depends_on),
                 abstain_below=float(abstain_below) if abstain_below is not None else None, **options), warnings


def _integer_labels(name: str, spec: dict, raw_labels: Any, found: list[str]) -> tuple[str, ...]:
    """The labels of an ``integer`` field: ``minimum..maximum`` as decimal strings."""
    lo, hi = spec.get("minimum"), spec.get("maximum")
    if raw_labels is not None:
        found.append(f"field {name!r}: an integer takes 'minimum' and 'maximum', not labels")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi)):
        found.append(f"field {name!r}: an integer needs whole-number 'minimum' and 'maximum' (got {lo!r} and {hi!r})")
        return BOOLEAN_LABELS
    if hi <= lo:
        found.append(f"field {name!r}: 'maximum' ({hi}) must be above 'minimum' ({lo})")
    elif hi - lo + 1 > MAX_INTEGER_VALUES:
        found.append(f"field {name!r}: {hi - lo + 1} values from {lo} to {hi}; an integer field may have at most "
                     f"{MAX_INTEGER_VALUES} (each value is a label path read in the same pass); use a coarser scale")
    else:
        return tuple(str(v) for v in range(lo, hi + 1))
    return BOOLEAN_LABELS


def _type_option_values(name: str, ftype: Any, spec: dict, labels: tuple[str, ...], found: list[str]) -> dict:
    """Validate the type-specific keys (``nullable``, ``none_label``, ``minimum``/``maximum``,
    ``threshold``, ``min_items``, ``max_items``); return those to set on ``Field``."""
    out: dict[str, Any] = {}

    def refuse(key: str, types: str) -> None:
        found.append(f"field {name!r}: {key!r} applies to {types} fields only, not to type {ftype}")

    for key in ("minimum", "maximum"):
        if key in spec and ftype != "integer":
            refuse(key, "integer")
    nullable = spec.get("nullable", False)
    if not isinstance(nullable, bool):
        found.append(f"field {name!r}: 'nullable' must be true or false, got {nullable!r}")
    elif nullable and ftype == "multi":
        refuse("nullable", "boolean, enum, ordinal and integer")
    elif nullable:
        if NULL_LABEL in labels and ftype != "boolean":
            found.append(f"field {name!r}: a nullable field cannot also have a label {NULL_LABEL!r}: the null option "
                         "is written null; rename that label")
        out["nullable"] = True
    none_label = spec.get("none_label")
    if none_label is not None:
        if ftype not in ("enum", "ordinal"):
            refuse("none_label", "enum and ordinal")
        elif not isinstance(none_label, str) or not none_label.strip():
            found.append(f"field {name!r}: 'none_label' must be a non-empty string, got {none_label!r}")
        elif none_label in labels:
            found.append(f"field {name!r}: none_label {none_label!r} is already one of its labels; none_label adds "
                         "it (remove it from the labels)")
        else:
            out["none_label"] = none_label
    multi_keys = [k for k in ("threshold", "min_items", "max_items") if k in spec]
    if ftype == "multi" and spec.get("abstain_below") is not None:
        refuse("abstain_below", "boolean, enum, ordinal and integer")
    if ftype != "multi":
        for key in multi_keys:
            refuse(key, "multi")
        return out
    threshold = spec.get("threshold", 0.5)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold < 1:
        found.append(f"field {name!r}: 'threshold' must be a probability between 0 and 1 (exclusive), got {threshold!r}")
    else:
        out["threshold"] = float(threshold)
    lo, hi = spec.get("min_items", 0), spec.get("max_items")
    if isinstance(lo, bool) or not isinstance(lo, int) or lo < 0:
        found.append(f"field {name!r}: 'min_items' must be a whole number >= 0, got {lo!r}")
    elif hi is not None and (isinstance(hi, bool) or not isinstance(hi, int) or hi < max(lo, 1)):
        found.append(f"field {name!r}: 'max_items' must be a whole number >= max(1, min_items), got {hi!r}")
    elif lo > len(labels) or len(labels) > MAX_MULTI_OPTIONS:
        found.append(f"field {name!r}: {len(labels)} options with min_items {lo}; a multi field has at most "
                     f"{MAX_MULTI_OPTIONS} options and min_items at most their number")
    else:
        out.update(min_items=lo, max_items=hi)
    return out


def _label_problems(name: str, raw_labels: list, written_labels: list, warnings: list[str], *,
                    kind: str = "enum") -> list[str]:
    """Every problem of an enum's labels (non-string, empty, whitespace, duplicates); soft ones go to ``warnings``."""
    found = []
    for i, label in enumerate(raw_labels):
        if not isinstance(label, str):
            found.append(_not_text_label(name, i + 1, label, written_labels[i]))
        elif label == "":
            found.append(f"field {name!r}: label #{i + 1} is empty")
        elif not label.strip():
            found.append(f"field {name!r}: label #{i + 1} is only whitespace ({label!r}); the model cannot "
                         "write it in a way that means anything; give it a name")
    if len(raw_labels) < 2:
        found.append(f"field {name!r}: {'a' if kind == 'multi' else 'an'} {kind} needs at least two labels, "
                     f"got {raw_labels!r}")
    exact: set[str] = set()
    folded: dict[str, str] = {}
    stripped: dict[str, str] = {}
    for label in raw_labels:
        if not isinstance(label, str) or not label.strip():
            continue
        if label in exact:
            found.append(f"field {name!r}: duplicate label {label!r}")
            continue
        exact.add(label)
        if stripped.setdefault(label.strip(), label) != label:
            found.append(f"field {name!r}: labels {stripped[label.strip()]!r} and {label!r} differ only by "
                         "surrounding whitespace; the catalog shows them as the same word to the model, "
                         "so keep one (or rename one)")
            continue
        if label != label.strip():
            warnings.append(f"field {name!r}: label {label!r} has surrounding whitespace; the model must write "
                            "it inside the quotes to pick this label (it is returned exactly as written); "
                            "remove it unless the downstream system needs it")
        key = label.casefold()
        if key in folded:
            warnings.append(f"field {name!r}: labels {folded[key]!r} and {label!r} differ only by case")
        folded.setdefault(key, label)
    return found


def check_keys(mapping: dict, known: tuple[str, ...], where: str, problems: list[str] | None = None) -> None:
    """Refuse a key pcd does not know (a typo like ``descripton`` would otherwise be ignored
    silently), naming it and the nearest known key; every unknown key is one problem.

    Raises:
        SchemaError: ``<where>: unknown key 'descripton' (did you mean 'description'?)``, when
            ``problems`` is not given (else the messages are appended to it).
    """
    found = unknown_key_problems(mapping, known, where)
    if problems is None:
        raise_all(found, "schema")
    else:
        problems.extend(found)


def raise_all(problems: list[str], source: str) -> None:
    """Raise one ``SchemaError`` for ``problems``: the message itself when there is one, else
    ``<source> has N problems:`` and one indented line each."""
    if len(problems) == 1:
        raise SchemaError(problems[0])
    if problems:
        raise SchemaError(f"{source} has {len(problems)} problems:\n" + "\n".join(f"  {p}" for p in problems))


def depends_problems(name: str, depends_on: list[str], all_names: set[str], first: bool) -> list[str]:
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


def nearest(name: object, known, *, cutoff: float = 0.6) -> str | None:
    """The known name closest to ``name`` (``difflib.get_close_matches``, similarity ratio at least
    ``cutoff``), or ``None``: the "did you mean" of every unknown key or field message."""
    import difflib

    near = difflib.get_close_matches(str(name), list(known), n=1, cutoff=cutoff)
    return near[0] if near else None


def unknown_key_problems(mapping, known: tuple[str, ...], where: str, *, cutoff: float = 0.6) -> list[str]:
    """One problem per key of ``mapping`` not in ``known``:
    ``<where>: unknown key 'descripton' (did you mean 'description'?)``, or the known keys listed
    when none is near (``nearest``)."""
    found = []
    for key in mapping:
        if key not in known:
            near = nearest(key, known, cutoff=cutoff)
            hint = f"did you mean {near!r}?" if near else f"known keys: {', '.join(known)}"
            found.append(f"{where}: unknown key {key!r} ({hint})")
    return found
