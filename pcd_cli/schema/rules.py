"""Rules between fields: constraints the written labels must satisfy together, searched exactly.

A schema's ``rules:`` list (``"x-pcd-rules"`` at the top of a JSON Schema; ``__pcd_rules__``
or ``model_config = {"json_schema_extra": {"x-pcd-rules": [...]}}`` on a Pydantic model)::

    rules:
      - {if: {severity_tier: SEV_0_CRITICAL}, then: {sla_breach_risk: true}}
      - {if: {is_outage: true}, not: {severity_tier: [SEV_3_MINOR]}}
      - {if: {severity_tier: [SEV_0_CRITICAL, SEV_1_MAJOR], is_outage: true}, then: {escalate: true}}
      - {at_most_one: [refund_requested, chargeback_filed]}
      - {exactly_one: [is_bug, is_question, is_request]}

* ``if``: field -> label, or a list of labels (any of them); the rule applies when every
  field named holds one of its labels. ``then``: each field named must hold one of its
  labels; ``not``: none of its labels. A rule has ``if`` and ``then`` and/or ``not``.
* ``at_most_one`` / ``exactly_one``: a list of two or more boolean fields, of which at most
  (exactly) one is true.
* Booleans are written ``true``/``false`` (YAML or JSON booleans, or the strings), integers
  as numbers, the null option of a nullable field as ``null``; enum labels exactly.

The rules act after decoding (and after calibration or prior correction, before abstaining),
on the fields' distributions; the model is never asked again. The written labels are the
most probable joint assignment that satisfies every rule, where an assignment's probability
is the product of its labels' probabilities under each field's own distribution (the fields
are taken as independent). Fields no rule names keep their label.

Cost and limit: the fields rules link (directly or through other rules) form a component;
a component's joint space is the product of its fields' label counts, and a schema whose
component exceeds ``MAX_JOINT_SPACE`` (10^6) is refused at load. At load, each component's
set of allowed assignments is built once as a boolean mask (one byte per assignment, numpy),
which also finds rules no assignment can satisfy (refused, naming the rules): tens of
milliseconds at 10^6. Per record: when the decoder's labels already satisfy the rules (one
Python check per rule), nothing else is done; otherwise the component's joint
log-probability is summed over its whole space (flat outer sums: about two additions and
8 bytes per assignment) and the best allowed assignment is taken, exactly: about 5 ms per
such record at 10^6 assignments, 0.1-0.3 ms for a few small fields (measured on a shared
2-core CPU). There is no per-record cap to hit: the load-time limit bounds the work.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from .fields import nearest, unknown_key_problems
from .model import JOINT_COLUMN

#: Largest joint space (product of label counts) of the fields one group of linked rules
#: names; larger ones are refused at schema load.
MAX_JOINT_SPACE = 1_000_000
#: Keys a rule may have.
RULE_KEYS = ("if", "then", "not", "at_most_one", "exactly_one")

Cond = tuple[tuple[str, tuple[int, ...]], ...]  # (field name, label indices), in the order written


@dataclass(frozen=True)
class Rule:
    """One validated rule.

    Attributes:
        index: its position in the schema's ``rules`` list (messages say ``rules[index]``).
        when: ``if``: (field, allowed label indices) pairs, all of which must hold.
        then: (field, label indices one of which it must take) pairs.
        forbid: ``not``: (field, label indices it must not take) pairs.
        count: ``"at_most_one"``, ``"exactly_one"`` or ``""`` (an if-rule).
        among: for a count rule: (boolean field, index of its ``true`` label) pairs.
        text: the rule in words (``if severity_tier = SEV_0_CRITICAL then sla_breach_risk = true``).
        canonical: the rule as compact JSON with labels as strings (schema hash, metadata).
    """

    index: int
    when: Cond = ()
    then: Cond = ()
    forbid: Cond = ()
    count: str = ""
    among: tuple[tuple[str, int], ...] = ()
    text: str = ""
    canonical: str = ""

    @property
    def fields(self) -> tuple[str, ...]:
        """The fields the rule names, in the order written."""
        if self.count:
            return tuple(name for name, _ in self.among)
        return tuple(name for name, _ in self.when + self.then + self.forbid)

    def holds(self, labels: dict[str, int]) -> bool:
        """Whether the assignment ``labels`` (field name -> label index) satisfies the rule."""
        if self.count:
            trues = sum(labels[name] == true for name, true in self.among)
            return trues <= 1 if self.count == "at_most_one" else trues == 1
        if not all(labels[name] in allowed for name, allowed in self.when):
            return True
        return all(labels[name] in allowed for name, allowed in self.then) and \
            all(labels[name] not in banned for name, banned in self.forbid)

    def to_dict(self) -> dict:
        """The rule as plain JSON data (``pcd.rules``, ``inspect-schema --json``)."""
        return json.loads(self.canonical)


def parse_rules(raw: Any, fields: Sequence, problems: list[str], warnings: list[str] | None = None) -> tuple[Rule, ...]:
    """Validate a schema's ``rules`` list against its (sound) declared fields.

    Every problem is appended to ``problems``, each naming the rule (``rules[2]: ...``) and the
    field: an unknown key, field or label, a value of the wrong kind, a field named twice in
    one rule, a count rule over non-boolean fields; then, when each rule is sound, a group of
    linked rules whose joint space exceeds ``MAX_JOINT_SPACE``, and rules no assignment can
    satisfy together (found exactly over the label space, naming the smallest set of them
    that conflicts). A label the rules never allow is a warning (appended to ``warnings``).

    Returns:
        The rules read (those with problems left out).
    """
    if raw is None:
        return ()
    if not isinstance(raw, list):
        problems.append("schema: 'rules' must be a list of rules ({if: {...}, then: {...}}, {at_most_one: [...]})")
        return ()
    by_name = {f.name: f for f in fields}
    rules: list[Rule] = []
    found: list[str] = []
    for i, spec in enumerate(raw):
        rule = _parse_rule(i, spec, by_name, found)
        if rule is not None:
            rules.append(rule)
    if JOINT_COLUMN in by_name and raw:
        found.append(f"field {JOINT_COLUMN!r}: clashes with the output column {JOINT_COLUMN!r} that rules add; "
                     "rename the field")
    problems.extend(found)
    if found:
        return tuple(rules)
    sizes = {f.name: len(f.labels) for f in fields}
    for names, members in components(rules, [f.name for f in fields]):
        space = math.prod(sizes[n] for n in names)
        if space > MAX_JOINT_SPACE:
            problems.append(f"{_rule_list(members)} link the fields {', '.join(names)}, whose labels combine into "
                            f"{space:,} assignments, more than the {MAX_JOINT_SPACE:,} pcd searches exactly; "
                            "split the rules or take a field out of them")
            continue
        problem = _unsatisfiable(members, sizes)
        if problem:
            problems.append(problem)
        elif warnings is not None:
            warnings.extend(_never_allowed(members, names, sizes, by_name))
    return tuple(rules)


def components(rules: Sequence[Rule], order: Sequence[str]) -> list[tuple[tuple[str, ...], tuple[Rule, ...]]]:
    """Groups of linked rules: (their fields in ``order``, the rules), by first field in ``order``."""
    parent: dict[str, str] = {}

    def root(name: str) -> str:
        while parent.setdefault(name, name) != name:
            name = parent[name]
        return name

    for rule in rules:
        names = rule.fields
        for name in names[1:]:
            parent[root(name)] = root(names[0])
        root(names[0])
    position = {name: i for i, name in enumerate(order)}
    groups: dict[str, list[str]] = {}
    for name in sorted(parent, key=lambda n: position.get(n, len(position))):
        groups.setdefault(root(name), []).append(name)
    return [(tuple(names), tuple(r for r in rules if root(r.fields[0]) == key)) for key, names in groups.items()]


def rule_components(schema) -> list[dict]:
    """Per group of linked rules of ``schema``: ``{"fields": [...], "rules": [indices],
    "joint_space": int}`` (what ``inspect-schema`` shows)."""
    sizes = {f.name: len(f.labels) for f in schema.fields}
    return [{"fields": list(names), "rules": [r.index for r in members],
             "joint_space": math.prod(sizes[n] for n in names)}
            for names, members in components(schema.rules, [f.name for f in schema.fields])]


def rules_metadata(schema) -> dict[str, str]:
    """``{"pcd.rules": <JSON list of the rules>}`` for a schema with rules, else ``{}``."""
    if not schema.rules:
        return {}
    return {"pcd.rules": json.dumps([r.to_dict() for r in schema.rules], separators=(",", ":"), ensure_ascii=False)}


def rule_fields(schema) -> tuple[str, ...]:
    """The fields the schema's rules name, in schema order (they get ``<f>__changed_by_rules``)."""
    named = {n for r in schema.rules for n in r.fields}
    return tuple(f.name for f in schema.fields if f.name in named)


class RuleSolver:
    """The rules of a schema, ready to apply to decoded records (built once per ``Labeler``).

    Each group of linked rules keeps its allowed-assignment mask (``MAX_JOINT_SPACE`` bytes at
    most); see the module docstring for the cost.
    """

    def __init__(self, schema):
        self.schema = schema
        sizes = {f.name: len(f.labels) for f in schema.fields}
        self.groups: list[tuple[tuple[int, ...], tuple[Rule, ...], np.ndarray]] = []
        for names, members in components(schema.rules, [f.name for f in schema.fields]):
            mask = _mask(members, names, sizes)
            self.groups.append((tuple(schema.field_index(n) for n in names), members, mask))
        self._banned = [~mask.ravel() for _, _, mask in self.groups]

    def best(self, group: int, probs: Sequence[Sequence[float]]) -> tuple[int, ...]:
        """The most probable allowed assignment of group ``group`` (label index per field)
        given each field's probabilities; ties go to the lowest label indices."""
        _, _, mask = self.groups[group]
        joint = np.zeros(1, dtype=np.float64)
        for p in reversed(probs):  # outer sums, flat in C order: about 2x the joint space in additions
            logp = np.log(np.maximum(np.asarray(p, dtype=np.float64), np.finfo(np.float64).tiny))
            joint = (logp[:, None] + joint[None, :]).ravel()
        np.copyto(joint, -np.inf, where=self._banned[group])
        return tuple(int(i) for i in np.unravel_index(int(np.argmax(joint)), mask.shape))

    def apply(self, result):
        """``result`` (a ``RecordResult``) with the rules applied: fields a rule moved get the
        label of the best allowed assignment (``value`` too, unless abstained; ``prob`` is the
        new label's probability under the field's own ``probs``, which stay as they were) and
        ``changed_by_rules``; ``joint_prob`` is the product of the written labels'
        probabilities over the fields the rules name.

        Where rules and conformal label sets meet: a field's set is computed from its own
        probabilities (so its coverage guarantee holds as fitted); when the rules write a label
        outside it, that label joins the set (last: it is less probable than every label in
        it), so a written label is always in its own set, the coverage can only rise, and
        ``--abstain-unless-single`` abstains on such a field (its set then holds two labels:
        the model's confident label and the one the rules chose)."""
        fields = list(result.fields)
        joint = 1.0
        for g, (indices, members, _) in enumerate(self.groups):
            current = {self.schema.fields[i].name: fields[i].label for i in indices}
            if all(rule.holds(current) for rule in members):
                chosen = tuple(fields[i].label for i in indices)
            else:
                chosen = self.best(g, [fields[i].probs for i in indices])
            for i, label in zip(indices, chosen):
                res = fields[i]
                if label != res.label:
                    f = self.schema.fields[i]
                    label_set = res.label_set
                    if label_set is not None and label not in label_set:
                        label_set = (*label_set, label)
                    res = replace(res, label=label, value=None if res.abstained else f.value(label),
                                  prob=float(res.probs[label]), changed_by_rules=True, label_set=label_set)
                    fields[i] = res
                joint *= float(res.probs[label])
        return replace(result, fields=tuple(fields), joint_prob=joint)


# --- parsing -----------------------------------------------------------------------------------


def _parse_rule(i: int, spec: Any, by_name: dict, found: list[str]) -> Rule | None:
    where = f"rules[{i}]"
    if not isinstance(spec, dict):
        found.append(f"{where}: expected a mapping such as {{if: {{field: label}}, then: {{field: label}}}} "
                     "or {at_most_one: [field, field]}")
        return None
    before = len(found)
    found.extend(unknown_key_problems(spec, RULE_KEYS, where, cutoff=0.5))
    counts = [k for k in ("at_most_one", "exactly_one") if k in spec]
    if counts:
        others = [k for k in spec if k in ("if", "then", "not") or k in counts[1:]]
        if others:
            found.append(f"{where}: {counts[0]} is a rule of its own; it takes no {others[0]!r} (write another rule)")
            return None
        return _count_rule(i, counts[0], spec[counts[0]], by_name, found) if len(found) == before else None
    if "then" not in spec and "not" not in spec:
        if len(found) == before:
            found.append(f"{where}: a rule needs 'if' with 'then' and/or 'not', or 'at_most_one' / 'exactly_one'")
        return None
    if "if" not in spec:
        if len(found) == before:  # else an unknown key ('iff') says it already
            found.append(f"{where}: 'then'/'not' need an 'if' (to forbid a label always, take it out of the "
                         "field's labels)")
        return None
    when = _cond(where, "if", spec["if"], by_name, found)
    then = _cond(where, "then", spec["then"], by_name, found) if "then" in spec else ()
    forbid = _cond(where, "not", spec["not"], by_name, found) if "not" in spec else ()
    if when is None or then is None or forbid is None:
        return None
    tested = {name for name, _ in when}
    for key, part in (("then", then), ("not", forbid)):
        for name, _ in part:
            if name in tested:
                found.append(f"{where}: field {name!r} is in both 'if' and {key!r}; a rule constrains other fields "
                             "than the ones it tests")
    both = {name for name, _ in then} & {name for name, _ in forbid}
    for name in sorted(both):
        found.append(f"{where}: field {name!r} is in both 'then' and 'not'; give the labels it may take once, "
                     "under 'then'")
    if len(found) != before:
        return None
    canonical = {"if": _labels_of(when, by_name)}
    if then:
        canonical["then"] = _labels_of(then, by_name)
    if forbid:
        canonical["not"] = _labels_of(forbid, by_name)
    consequence = [_says(n, ix, by_name) for n, ix in then] + [_says(n, ix, by_name, negate=True) for n, ix in forbid]
    text = f"if {' and '.join(_says(n, ix, by_name) for n, ix in when)} then {' and '.join(consequence)}"
    return Rule(index=i, when=when, then=then, forbid=forbid, text=text,
                canonical=json.dumps(canonical, ensure_ascii=False, separators=(",", ":")))


def _cond(where: str, key: str, raw: Any, by_name: dict, found: list[str]) -> Cond | None:
    """``if``/``then``/``not``: a non-empty mapping field -> label or list of labels."""
    if not isinstance(raw, dict) or not raw:
        found.append(f"{where}: {key!r} must be a mapping of field -> label (or list of labels), "
                     f"e.g. {{{key}: {{severity: HIGH}}}}")
        return None
    out: list[tuple[str, tuple[int, ...]]] = []
    ok = True
    for name, value in raw.items():
        field = _field(where, name, by_name, found)
        if field is None:
            ok = False
            continue
        values = value if isinstance(value, list) else [value]
        if not values:
            found.append(f"{where}: field {name!r} under {key!r} has an empty list of labels")
            ok = False
            continue
        indices: list[int] = []
        for v in values:
            index = _label(where, field, v, found)
            if index is None:
                ok = False
            elif index not in indices:
                indices.append(index)
        out.append((name, tuple(indices)))
    return tuple(out) if ok else None


def _count_rule(i: int, kind: str, raw: Any, by_name: dict, found: list[str]) -> Rule | None:
    where = f"rules[{i}]"
    if not isinstance(raw, list) or len(raw) < 2:
        found.append(f"{where}: {kind} takes a list of two or more boolean fields, got {raw!r}")
        return None
    among: list[tuple[str, int]] = []
    ok = True
    for name in raw:
        field = _field(where, name, by_name, found)
        if field is None:
            ok = False
            continue
        if not field.is_boolean:
            found.append(f"{where}: {kind} counts true values; field {name!r} is {field.type}, not boolean")
            ok = False
            continue
        if any(name == seen for seen, _ in among):
            found.append(f"{where}: {kind} names field {name!r} twice")
            ok = False
            continue
        among.append((name, field.label_index(True)))
    if not ok:
        return None
    words = "at most one" if kind == "at_most_one" else "exactly one"
    return Rule(index=i, count=kind, among=tuple(among),
                text=f"{words} of {', '.join(n for n, _ in among)} is true",
                canonical=json.dumps({kind: [n for n, _ in among]}, ensure_ascii=False, separators=(",", ":")))


def _field(where: str, name: Any, by_name: dict, found: list[str]):
    """The declared field ``name``, or ``None`` with the problem appended."""
    field = by_name.get(name) if isinstance(name, str) else None
    if field is None:
        near = nearest(name, by_name)
        found.append(f"{where}: names an unknown field {name!r}" + (f" (did you mean {near!r}?)" if near else ""))
        return None
    if getattr(field, "is_multi", False):
        found.append(f"{where}: field {name!r} is multi-select; rules take fields with one label each "
                     "(boolean, enum, ordinal, integer)")
        return None
    return field


def _label(where: str, field, value: Any, found: list[str]) -> int | None:
    from ..errors import SchemaError

    if isinstance(value, (list, dict)):
        found.append(f"{where}: field {field.name!r}: {value!r} is not a label")
        return None
    try:
        return field.label_index(value, where=where)
    except SchemaError as exc:
        hint = ""
        if isinstance(value, (bool, int, float)) and field.type in ("enum", "ordinal") and str(value) not in field.labels:
            hint = "; a label that YAML reads as a boolean or number must be quoted (\"NO\", \"007\")"
        found.append(str(exc) + hint)
        return None


def _labels_of(cond: Cond, by_name: dict) -> dict[str, list[str]]:
    return {name: [by_name[name].labels[i] for i in indices] for name, indices in cond}


def _says(name: str, indices: tuple[int, ...], by_name: dict, *, negate: bool = False) -> str:
    labels = [by_name[name].labels[i] for i in indices]
    if len(labels) == 1:
        return f"{name} {'!=' if negate else '='} {labels[0]}"
    return f"{name} {'not in' if negate else 'in'} {{{', '.join(labels)}}}"


def _rule_list(rules: Sequence[Rule]) -> str:
    names = [f"rules[{r.index}]" for r in rules]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


# --- the exact search over label space -------------------------------------------------------------


def _mask(rules: Sequence[Rule], names: Sequence[str], sizes: dict[str, int]) -> np.ndarray:
    """Boolean array over the joint space of ``names`` (axis per field, in that order): which
    assignments satisfy every rule of ``rules``."""
    axis = {name: a for a, name in enumerate(names)}
    shape = tuple(sizes[n] for n in names)

    def member(name: str, indices: Sequence[int]) -> np.ndarray:
        arr = np.zeros(sizes[name], dtype=bool)
        arr[list(indices)] = True
        return arr.reshape([-1 if a == axis[name] else 1 for a in range(len(names))])

    mask = np.ones(shape, dtype=bool)
    for rule in rules:
        if rule.count:
            trues = sum((member(n, [t]).astype(np.int16) for n, t in rule.among), np.zeros((), dtype=np.int16))
            ok = trues <= 1 if rule.count == "at_most_one" else trues == 1
        else:
            cond = np.ones((), dtype=bool)
            for n, ix in rule.when:
                cond = cond & member(n, ix)
            cons = np.ones((), dtype=bool)
            for n, ix in rule.then:
                cons = cons & member(n, ix)
            for n, ix in rule.forbid:
                cons = cons & ~member(n, ix)
            ok = ~cond | cons
        mask &= ok
    return mask


def _never_allowed(rules: Sequence[Rule], names: Sequence[str], sizes: dict[str, int], by_name: dict) -> list[str]:
    """A warning per field with labels no allowed assignment of its group has (pcd never writes them)."""
    return [message for _, _, message in _never_allowed_labels(rules, names, sizes, by_name)]


def _never_allowed_labels(rules: Sequence[Rule], names: Sequence[str], sizes: dict[str, int],
                          by_name: dict) -> list[tuple[str, tuple[str, ...], str]]:
    """(field, labels no allowed assignment of the group has, the warning), per such field."""
    mask = _mask(rules, names, sizes)
    out = []
    for axis, name in enumerate(names):
        allowed = mask.any(axis=tuple(a for a in range(mask.ndim) if a != axis))
        never = tuple(by_name[name].labels[i] for i in np.flatnonzero(~allowed))
        if never:
            verb = "never allows" if len(rules) == 1 else "together never allow"
            out.append((name, never, f"{_rule_list(rules)} {verb} {name} = {' | '.join(never)}; pcd will never "
                        f"write {'it' if len(never) == 1 else 'them'}"))
    return out


def never_allowed(schema) -> list[tuple[str, tuple[str, ...], str]]:
    """Labels the schema's rules make impossible: per field, ``(field, labels, warning)``, the
    warning being the one ``parse_rules`` adds to ``Schema.warnings`` (``pcd label`` prints it;
    ``inspect-schema`` reports it as a ``rule_never_allows`` finding)."""
    by_name = {f.name: f for f in schema.fields}
    sizes = {f.name: len(f.labels) for f in schema.fields}
    return [found for names, members in components(schema.rules, [f.name for f in schema.fields])
            for found in _never_allowed_labels(members, names, sizes, by_name)]


def _satisfiable(rules: Sequence[Rule], sizes: dict[str, int]) -> bool:
    names = list(dict.fromkeys(n for r in rules for n in r.fields))
    return bool(_mask(rules, names, sizes).any())


def _unsatisfiable(rules: Sequence[Rule], sizes: dict[str, int]) -> str | None:
    """``None`` when some assignment satisfies all of ``rules`` (one linked group); else the
    message naming the first rule (in list order) that makes them unsatisfiable and a
    smallest set of earlier rules it conflicts with."""
    if _satisfiable(rules, sizes):
        return None
    last = next(j for j in range(1, len(rules) + 1) if not _satisfiable(rules[:j], sizes)) - 1
    needed = list(rules[:last])
    for rule in list(needed):  # deletion: drop every earlier rule the conflict does not need
        trial = [r for r in needed if r is not rule] + [rules[last]]
        if not _satisfiable(trial, sizes):
            needed.remove(rule)
    core = needed + [rules[last]]
    names = list(dict.fromkeys(n for r in core for n in r.fields))
    if not needed:
        return (f"rules[{rules[last].index}] can never hold: no labels of {', '.join(names)} satisfy it "
                f"({rules[last].text})")
    return (f"rules[{rules[last].index}] cannot hold together with {_rule_list(needed)}: no labels of "
            f"{', '.join(names)} satisfy them all ({'; '.join(r.text for r in core)})")
