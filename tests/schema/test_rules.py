"""Rules between fields (``pcd_cli.schema.rules``): validation, the exact search against brute-force
enumeration, the Labeler pipeline, and ``pcd label`` writing and reading the new columns."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import pcd_cli.backends
from pcd_cli.api import Labeler
from pcd_cli.results import FieldResult, RecordResult
from pcd_cli.errors import Interrupted, SchemaError
from pcd_cli.io.readers import InputSpec
from pcd_cli.engines.local import label_file
from pcd_cli.schema.rules import MAX_JOINT_SPACE, RuleSolver, rule_components
from pcd_cli.schema.load import load_schema, parse_schema

from ..helpers import ORACLE_SCHEMA, TEXTS, pcd, tiny_backend

FIELDS = {
    "severity_tier": {"type": "enum", "labels": ["SEV_0_CRITICAL", "SEV_1_MAJOR", "SEV_2_MODERATE", "SEV_3_MINOR"]},
    "sla_breach_risk": {"type": "boolean"},
    "is_outage": {"type": "boolean"},
    "refund_requested": {"type": "boolean"},
    "chargeback_filed": {"type": "boolean"},
    "topic": {"type": "enum", "labels": ["BILLING", "TECH", "OTHER"]},
}
ISSUE_RULES = [  # the examples of issue #17
    {"if": {"severity_tier": "SEV_0_CRITICAL"}, "then": {"sla_breach_risk": True}},
    {"if": {"is_outage": True}, "not": {"severity_tier": ["SEV_3_MINOR"]}},
    {"at_most_one": ["refund_requested", "chargeback_filed"]},
]


def schema_with(rules, fields=FIELDS):
    return parse_schema({"name": "t", "fields": fields, "rules": rules})


def problems_of(rules, fields=FIELDS) -> str:
    with pytest.raises(SchemaError) as info:
        schema_with(rules, fields)
    return str(info.value)


# -- reading and validating -------------------------------------------------------------------------

def test_the_issue_examples_read_and_keep_the_hash_of_a_schema_without_rules():
    schema = schema_with(ISSUE_RULES)
    assert [r.text for r in schema.rules] == [
        "if severity_tier = SEV_0_CRITICAL then sla_breach_risk = true",
        "if is_outage = true then severity_tier != SEV_3_MINOR",
        "at most one of refund_requested, chargeback_filed is true"]
    assert schema.rules[1].to_dict() == {"if": {"is_outage": ["true"]}, "not": {"severity_tier": ["SEV_3_MINOR"]}}
    plain = parse_schema({"name": "t", "fields": FIELDS})
    assert plain.rules == () and parse_schema({"name": "t", "fields": FIELDS, "rules": []}).source_sha256 == \
        plain.source_sha256
    assert schema.source_sha256 != plain.source_sha256  # resume and calibration see the rules
    assert rule_components(schema) == [
        {"fields": ["severity_tier", "sla_breach_risk", "is_outage"], "rules": [0, 1], "joint_space": 16},
        {"fields": ["refund_requested", "chargeback_filed"], "rules": [2], "joint_space": 4}]


def test_every_problem_of_the_rules_is_named_at_once():
    message = problems_of([
        {"if": {"severity": "SEV_0_CRITICAL"}, "then": {"sla_breach_risk": True}},
        {"if": {"severity_tier": "SEV_9"}, "then": {"sla_breach_risk": "maybe"}},
        {"at_most_one": ["refund_requested", "topic"]},
        {"if": {"topic": "TECH"}, "then": {"topic": "BILLING"}},
        {"if": {"topic": "TECH"}, "then": {"is_outage": True}, "not": {"is_outage": False}},
        {"iff": {"topic": "TECH"}, "then": {"is_outage": True}},
        {"then": {"is_outage": True}},
        {"at_most_one": ["is_outage"]},
        "is_outage",
    ])
    assert message.startswith("schema has 10 problems:")
    for line in ["rules[0]: names an unknown field 'severity' (did you mean 'severity_tier'?)",
                 "rules[1]: field 'severity_tier': 'SEV_9' is not one of its labels (SEV_0_CRITICAL | SEV_1_MAJOR | "
                 "SEV_2_MODERATE | SEV_3_MINOR)",
                 "rules[1]: field 'sla_breach_risk': 'maybe' is not one of its labels (true | false)",
                 "rules[2]: at_most_one counts true values; field 'topic' is enum, not boolean",
                 "rules[3]: field 'topic' is in both 'if' and 'then'",
                 "rules[4]: field 'is_outage' is in both 'then' and 'not'",
                 "rules[5]: unknown key 'iff' (did you mean 'if'?)",
                 "rules[6]: 'then'/'not' need an 'if'",
                 "rules[7]: at_most_one takes a list of two or more boolean fields",
                 "rules[8]: expected a mapping"]:
        assert line in message


def test_rules_no_assignment_satisfies_are_refused_naming_the_conflict():
    message = problems_of([
        {"at_most_one": ["refund_requested", "chargeback_filed"]},          # not part of the conflict
        {"if": {"topic": ["BILLING", "TECH", "OTHER"]}, "then": {"is_outage": True}},
        {"if": {"is_outage": True}, "then": {"severity_tier": "SEV_0_CRITICAL"}},
        {"if": {"topic": "OTHER"}, "then": {"sla_breach_risk": False}},     # not part of it either
        {"if": {"severity_tier": "SEV_0_CRITICAL"}, "not": {"topic": ["BILLING", "TECH", "OTHER"]}},
    ])
    assert message.startswith("rules[4] cannot hold together with rules[1] and rules[2]: no labels of ")
    assert "rules[0]" not in message and "rules[3]" not in message
    alone = problems_of([{"if": {"is_outage": [True, False]}, "not": {"topic": ["BILLING", "TECH", "OTHER"]}}])
    assert alone.startswith("rules[0] can never hold")
    with pytest.raises(SchemaError, match=r"exactly_one names field 'is_outage' twice"):
        schema_with([{"exactly_one": ["is_outage", "is_outage"]}])


def test_a_label_the_rules_never_allow_is_a_warning():
    schema = schema_with([{"if": {"topic": "TECH"}, "then": {"is_outage": True}},
                          {"if": {"topic": "TECH"}, "then": {"is_outage": False}}])
    assert schema.warnings == ("rules[0] and rules[1] together never allow topic = TECH; pcd will never write it",)


def test_a_group_of_linked_rules_past_the_limit_is_refused():
    fields = {f"f{i}": {"type": "enum", "labels": [f"L{j}" for j in range(10)]} for i in range(7)}
    rules = [{"if": {f"f{i}": "L0"}, "then": {f"f{i + 1}": "L0"}} for i in range(6)]
    message = problems_of(rules, fields)
    assert f"combine into 10,000,000 assignments, more than the {MAX_JOINT_SPACE:,}" in message
    assert message.startswith("rules[0], rules[1], rules[2], rules[3], rules[4] and rules[5] link the fields f0,")
    schema_with(rules[:5], fields)  # 10^6: searched


def test_json_schema_and_pydantic_carry_the_rules(tmp_path):
    pydantic = pytest.importorskip("pydantic")
    from typing import Literal

    rules = [{"if": {"topic": "TECH"}, "then": {"is_outage": True}}, {"at_most_one": ["is_outage", "refund"]}]

    class Ticket(pydantic.BaseModel):
        model_config = {"json_schema_extra": {"x-pcd-rules": rules}}
        topic: Literal["BILLING", "TECH"]
        is_outage: bool
        refund: bool

    class Attr(pydantic.BaseModel):
        __pcd_rules__ = rules
        topic: Literal["BILLING", "TECH"]
        is_outage: bool
        refund: bool

    from pcd_cli.schema.load import schema_from_model

    by_config, by_attr = schema_from_model(Ticket), schema_from_model(Attr)
    path = tmp_path / "ticket.schema.json"
    path.write_text(json.dumps(Ticket.model_json_schema()))
    by_json = load_schema(path)
    assert Ticket.model_json_schema()["x-pcd-rules"] == rules
    assert [r.canonical for r in by_config.rules] == [r.canonical for r in by_attr.rules] == \
        [r.canonical for r in by_json.rules]
    assert by_json.source_sha256 == by_config.source_sha256
    bad = Ticket.model_json_schema() | {"x-pcd-rules": [{"if": {"topic": "SALES"}, "then": {"refund": True}}]}
    path.write_text(json.dumps(bad))
    with pytest.raises(SchemaError, match=r"rules\[0\]: field 'topic': 'SALES' is not one of its labels"):
        load_schema(path)


# -- the exact search against brute force --------------------------------------------------------------

def _strings(value, boolean: bool) -> set[str]:
    values = value if isinstance(value, list) else [value]
    return {("true" if v else "false") if boolean else v for v in values}


def holds(rule: dict, labels: dict[str, str], fields: dict) -> bool:
    """The rule's meaning, written again from the issue's words, on label strings."""
    for kind in ("at_most_one", "exactly_one"):
        if kind in rule:
            trues = sum(labels[n] == "true" for n in rule[kind])
            return trues <= 1 if kind == "at_most_one" else trues == 1
    is_bool = {n: spec["type"] == "boolean" for n, spec in fields.items()}
    if not all(labels[n] in _strings(v, is_bool[n]) for n, v in rule["if"].items()):
        return True
    return all(labels[n] in _strings(v, is_bool[n]) for n, v in rule.get("then", {}).items()) and \
        not any(labels[n] in _strings(v, is_bool[n]) for n, v in rule.get("not", {}).items())


def rule_names(rule: dict) -> set[str]:
    return {n for key, part in rule.items() for n in (part if isinstance(part, list) else part.keys())}


@st.composite
def problems(draw):
    """Random small fields, random rules over them, random probabilities (ties and zeros included)."""
    fields = {}
    for i in range(draw(st.integers(2, 5))):
        if draw(st.booleans()):
            fields[f"b{i}"] = {"type": "boolean"}
        else:
            fields[f"e{i}"] = {"type": "enum", "labels": [f"L{j}" for j in range(draw(st.integers(2, 4)))]}
    names = list(fields)
    labels = {n: ["true", "false"] if s["type"] == "boolean" else s["labels"] for n, s in fields.items()}
    bools = [n for n in names if fields[n]["type"] == "boolean"]

    def value(name):
        chosen = draw(st.lists(st.sampled_from(labels[name]), min_size=1, max_size=len(labels[name]), unique=True))
        chosen = [v == "true" for v in chosen] if name in bools else chosen
        return chosen[0] if len(chosen) == 1 and draw(st.booleans()) else chosen

    rules = []
    for _ in range(draw(st.integers(1, 4))):
        kinds = ["then", "not", "both"] + (["at_most_one", "exactly_one"] if len(bools) >= 2 else [])
        kind = draw(st.sampled_from(kinds))
        if kind in ("at_most_one", "exactly_one"):
            rules.append({kind: draw(st.lists(st.sampled_from(bools), min_size=2, max_size=len(bools), unique=True))})
            continue
        order = draw(st.permutations(names))
        n_if = draw(st.integers(1, len(names) - 1))
        rest = order[n_if:][: draw(st.integers(1, len(names) - n_if))]
        rule = {"if": {n: value(n) for n in order[:n_if]}}
        if kind == "both" and len(rest) >= 2:
            rule["then"], rule["not"] = {rest[0]: value(rest[0])}, {n: value(n) for n in rest[1:]}
        else:
            rule["not" if kind == "not" else "then"] = {n: value(n) for n in rest}
        rules.append(rule)
    probs = {}
    for n in names:
        raw = draw(st.lists(st.sampled_from([0.0, 0.05, 0.1, 0.25, 0.5, 1.0]) | st.floats(0.0, 1.0),
                            min_size=len(labels[n]), max_size=len(labels[n])))
        total = sum(raw)
        probs[n] = [p / total for p in raw] if total > 0 else [1 / len(raw)] * len(raw)
    return fields, rules, probs


def _record(schema, probs) -> RecordResult:
    fields = []
    for f in schema.fields:
        p = probs[f.name]
        label = int(np.argmax(p))
        fields.append(FieldResult(label=label, value=f.value(label), prob=p[label], mass=1.0, probs=tuple(p)))
    return RecordResult(id="r", fields=tuple(fields))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_the_search_finds_the_most_probable_assignment_that_brute_force_finds(problem):
    fields, rules, probs = problem
    names = list(fields)
    labels = {n: ["true", "false"] if s["type"] == "boolean" else s["labels"] for n, s in fields.items()}
    named = [n for n in names if any(n in rule_names(r) for r in rules)]
    feasible = []
    for combo in itertools.product(*(range(len(labels[n])) for n in names)):
        assignment = {n: labels[n][i] for n, i in zip(names, combo)}
        if all(holds(r, assignment, fields) for r in rules):
            feasible.append((math.prod(probs[n][i] for n, i in zip(names, combo) if n in named), combo))
    try:
        schema = schema_with(rules, fields)
    except SchemaError as exc:  # refused at load exactly when no assignment satisfies the rules
        assert not feasible, str(exc)
        assert "can never hold" in str(exc) or "cannot hold together" in str(exc)
        event("refused at load: no assignment satisfies the rules")
        return
    assert feasible
    record = _record(schema, probs)
    out = RuleSolver(schema).apply(record)
    written = {f.name: f.labels[res.label] for f, res in zip(schema.fields, out.fields)}
    assert all(holds(r, written, fields) for r in rules)
    best = max(p for p, _ in feasible)
    chosen = math.prod(probs[n][labels[n].index(written[n])] for n in named)
    assert chosen == pytest.approx(best, rel=1e-9, abs=1e-300)
    assert out.joint_prob == pytest.approx(chosen, rel=1e-9, abs=1e-300)
    decoder_labels = {n: labels[n][record.fields[i].label] for i, n in enumerate(names)}
    if all(holds(r, decoder_labels, fields) for r in rules):
        assert written == decoder_labels  # nothing moves when the decoder's labels are allowed
    event("rules moved labels" if written != decoder_labels else "labels kept")
    for f, before, after in zip(schema.fields, record.fields, out.fields):
        assert after.changed_by_rules == (after.label != before.label)
        assert after.probs == before.probs and after.prob == before.probs[after.label]
        assert after.value == f.value(after.label)
        if f.name not in named:
            assert after == before


def test_the_search_at_the_limit_is_exact_and_its_cost_is_bounded():
    """20 booleans in one group (2^20 = 1,048,576 > 10^6 is refused; 19: 524,288 searched)."""
    fields = {f"b{i}": {"type": "boolean"} for i in range(20)}
    with pytest.raises(SchemaError, match="1,048,576 assignments"):
        schema_with([{"exactly_one": list(fields)}], fields)
    fields = {f"b{i}": {"type": "boolean"} for i in range(19)}
    schema = schema_with([{"exactly_one": list(fields)}], fields)
    rng = np.random.default_rng(0)
    p_true = rng.uniform(0.05, 0.95, size=19)
    record = _record(schema, {f"b{i}": [p, 1 - p] for i, p in enumerate(p_true)})
    out = RuleSolver(schema).apply(record)
    # exactly one true: the best is the field whose odds p/(1-p) are highest
    expect = int(np.argmax(p_true / (1 - p_true)))
    assert [res.value for res in out.fields] == [i == expect for i in range(19)]


# -- the Labeler and pcd label --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def backend():
    return tiny_backend(chat_template=True, seed=3)


@pytest.fixture(scope="module")
def plain(backend):
    """Each text's decoder labels without rules (to write rules that must move something)."""
    return list(Labeler(parse_schema(ORACLE_SCHEMA), backend=backend).label(TEXTS))


def _moving_rules(plain) -> list[dict]:
    """Rules that the first text's decoder labels break (so rules must move urgent or refund)."""
    urgent, refund = plain[0].fields[0].value, plain[0].fields[4].value
    return [{"if": {"urgent": urgent}, "not": {"refund": [refund]}},
            {"if": {"tool": "get_time"}, "then": {"action": ["CALL", "CALL BACK"]}}]


def test_labeler_applies_rules_after_calibrated_probabilities_and_before_abstaining(backend, plain):
    rules = _moving_rules(plain)
    spec = json.loads(json.dumps(ORACLE_SCHEMA))
    spec["fields"]["refund"]["abstain_below"] = 0.5
    labeler = Labeler(parse_schema(spec | {"rules": rules}), backend=backend)
    got = list(labeler.label(TEXTS))
    assert any(res.changed_by_rules for res in got[0].fields)
    for before, after in zip(plain, got):
        assert after.joint_prob == pytest.approx(math.prod(after.fields[i].prob for i in (0, 2, 3, 4)), rel=1e-6)
        for b, a in zip(before.fields, after.fields):
            assert a.probs == b.probs and a.prob == a.probs[a.label]
            assert a.changed_by_rules == (a.label != b.label)
        refund = after.fields[4]
        assert refund.abstained == (refund.prob < 0.5) and (refund.value is None) == refund.abstained
    frame = labeler.label_frame(__import__("pandas").DataFrame({"text": TEXTS}))
    assert frame["__joint_prob"].tolist() == pytest.approx([r.joint_prob for r in got], rel=1e-6)
    assert frame["urgent__changed_by_rules"].tolist() == [r.fields[0].changed_by_rules for r in got]
    assert "deadline__changed_by_rules" not in frame.columns  # no rule names it
    assert json.loads(frame.attrs["metadata"]["pcd.rules"]) == [r.to_dict() for r in labeler.schema.rules]


def test_pcd_label_writes_the_rule_columns_and_resume_keeps_them(backend, plain, tmp_path, monkeypatch):
    rules = _moving_rules(plain)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS * 2)))
    yaml_schema = tmp_path / "rules.yaml"
    import yaml

    yaml_schema.write_text(yaml.safe_dump(ORACLE_SCHEMA | {"rules": rules}, sort_keys=False))
    monkeypatch.setattr(pcd_cli.backends, "load_backend", lambda *a, **k: backend)
    out = tmp_path / "out.parquet"
    result = pcd("label", str(src), "-s", str(yaml_schema), "--id-field", "id", "--all-probs",
                 "-o", str(out), "--no-progress", code=None)
    assert result.exit_code == 0, result.output
    assert "rules between fields moved " in " ".join(result.output.split())
    table = pq.read_table(out)
    rows = table.to_pylist()
    assert json.loads(table.schema.metadata[b"pcd.rules"]) == [
        {"if": {"urgent": [str(plain[0].fields[0].value).lower()]},
         "not": {"refund": [str(plain[0].fields[4].value).lower()]}},
        {"if": {"tool": ["get_time"]}, "then": {"action": ["CALL", "CALL BACK"]}}]
    for row, before in zip(rows, plain * 2):
        moved = {name: row[name] != res.value for name, res in zip(("urgent", "deadline", "action", "tool",
                                                                    "refund"), before.fields)}
        for name in ("urgent", "action", "tool", "refund"):
            assert row[f"{name}__changed_by_rules"] == moved[name]
            assert row[f"{name}__prob"] == pytest.approx(dict(row[f"{name}__probs"])[
                str(row[name]).lower() if isinstance(row[name], bool) else row[name]], abs=1e-6)
        assert not moved["deadline"] and "deadline__changed_by_rules" not in row
        assert row["__joint_prob"] == pytest.approx(math.prod(row[f"{n}__prob"] for n in
                                                              ("urgent", "action", "tool", "refund")), rel=1e-5)
        assert not (row["urgent"] == plain[0].fields[0].value and row["refund"] == plain[0].fields[4].value)
    assert rows[0]["urgent__changed_by_rules"] or rows[0]["refund__changed_by_rules"]

    # the same schema as a JSON Schema with "x-pcd-rules" gives the same labels
    js = {"title": "oracle", "type": "object", "properties": {
        n: {"description": s["description"]} | ({"type": "boolean"} if s["type"] == "boolean" else {"enum": s["labels"]})
        for n, s in ORACLE_SCHEMA["fields"].items()}, "x-pcd-rules": rules}
    js_path = tmp_path / "rules.schema.json"
    js_path.write_text(json.dumps(js))
    out_js = tmp_path / "out_js.parquet"
    result = pcd("label", str(src), "-s", str(js_path), "--id-field", "id", "-o", str(out_js),
                 "--no-progress", code=None)
    assert result.exit_code == 0, result.output
    again = pq.read_table(out_js).to_pylist()
    for name in ("urgent", "refund", "__joint_prob", "urgent__changed_by_rules", "refund__changed_by_rules"):
        assert [r[name] for r in again] == [r[name] for r in rows]

    # resume: an interrupted run continues with the rule columns of the parts done, counted in the summary
    labeler = Labeler(load_schema(yaml_schema), backend=backend)
    resumed = tmp_path / "resumed.parquet"
    polls = []
    kw = dict(errors_path=tmp_path / "resumed.errors.jsonl", progress=False, all_probs=True, batch_records=2,
              chunk_records=2)
    with pytest.raises(Interrupted):
        label_file(labeler, src, InputSpec(id_field="id"), output=resumed,
                   should_stop=lambda: polls.append(1) or len(polls) >= 3, **kw)
    stats = label_file(labeler, src, InputSpec(id_field="id"), output=resumed, resume=True, **kw)
    assert stats.decoded < len(rows)  # the first chunks came from the work folder
    done = pq.read_table(resumed)
    assert done.schema == pq.read_table(out).schema.remove_metadata()  # packing differs: floats up to rounding
    for name in ("id", "urgent", "refund", "action", "tool", "urgent__changed_by_rules", "refund__changed_by_rules"):
        assert done.column(name).to_pylist() == [r[name] for r in rows]
    assert done.column("__joint_prob").to_pylist() == pytest.approx([r["__joint_prob"] for r in rows], rel=1e-3)
    for n in ("urgent", "action", "tool", "refund"):
        assert stats.rule_changes[n] == sum(r[f"{n}__changed_by_rules"] for r in rows)
    assert stats.to_dict()["changed_by_rules"]["urgent"] == sum(r["urgent__changed_by_rules"] for r in rows)


def test_inspect_schema_lists_the_rules_and_their_joint_space(backend, tmp_path):
    from pcd_cli.inspect import inspect

    schema = parse_schema(ORACLE_SCHEMA | {"rules": [{"if": {"urgent": True}, "then": {"deadline": ["1_HOUR"]}},
                                                     {"at_most_one": ["urgent", "refund"]}]})
    from pcd_cli.inspect_render import render_inspection, report_json

    report = inspect(schema, tokenizer=backend.tokenizer)
    data = json.loads(report_json(report))  # what --json prints
    assert data["rules"][0] == {"index": 0, "text": "if urgent = true then deadline = 1_HOUR",
                                "rule": {"if": {"urgent": ["true"]}, "then": {"deadline": ["1_HOUR"]}}}
    assert data["rule_groups"] == [{"fields": ["urgent", "deadline", "refund"], "rules": [0, 1], "joint_space": 16}]
    from rich.console import Console

    console = Console(record=True, width=200)
    render_inspection(report, console)
    text = console.export_text()
    assert "rules[1]: at most one of urgent, refund is true" in text
    assert "rules[0], rules[1] link urgent, deadline, refund: joint space 16 assignments" in text


@pytest.mark.full  # starts a local Ray (about 30 s); make test-full runs it
def test_the_ray_engine_writes_what_the_local_engine_writes(backend, plain, tmp_path):
    ray = pytest.importorskip("ray")
    model_dir = tmp_path / "tiny-model"
    backend.model.save_pretrained(model_dir)
    backend.tokenizer._tok.save_pretrained(model_dir)
    schema = tmp_path / "rules.json"
    schema.write_text(json.dumps(ORACLE_SCHEMA | {"rules": _moving_rules(plain)}))
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS * 2)))
    common = [str(src), "--schema", str(schema), "--model", str(model_dir), "--device", "cpu", "--id-field", "id",
              "--all-probs", "--no-progress"]
    result = pcd("label", *common, "-o", str(tmp_path / "local.parquet"), code=None)
    assert result.exit_code == 0, result.output
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        result = pcd("label", *common, "-o", str(tmp_path / "ray.parquet"), "--engine", "ray",
                     "--workers", "1", "--batch-size", "2", code=None, env={"RAY_ADDRESS": None})
    finally:
        ray.shutdown()
    assert result.exit_code == 0, result.output
    assert "rules between fields moved " in " ".join(result.output.split())
    local, remote = pq.read_table(tmp_path / "local.parquet"), pq.read_table(tmp_path / "ray.parquet")
    assert "__joint_prob" in remote.schema.names and b"pcd.rules" in remote.schema.metadata
    assert remote.schema == local.schema  # metadata included, but for the run's own date
    skip = {b"pcd.created_utc"}
    assert {k: v for k, v in remote.schema.metadata.items() if k not in skip} == \
        {k: v for k, v in local.schema.metadata.items() if k not in skip}
    for name in local.schema.names:  # the batches are packed differently: floats up to rounding
        a, b = local.column(name).to_pylist(), remote.column(name).to_pylist()
        if isinstance(local.schema.field(name).type, pa.MapType):
            assert [dict(x) for x in b] == [pytest.approx(dict(x), abs=1e-4) for x in a], name
        elif pa.types.is_floating(local.schema.field(name).type):
            assert b == pytest.approx(a, rel=1e-3, abs=1e-5), name
        else:
            assert b == a, name


def test_an_empty_input_gets_the_rule_columns_without_a_model(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(pcd_cli.backends, "load_backend", refuse)
    schema = tmp_path / "rules.json"
    schema.write_text(json.dumps({"name": "t", "fields": FIELDS, "rules": ISSUE_RULES}))
    src = tmp_path / "empty.jsonl"
    src.write_text("")
    out = tmp_path / "empty.parquet"
    result = pcd("label", str(src), "-s", str(schema), "-o", str(out), "--no-progress", code=None)
    assert result.exit_code == 0, result.output
    table = pq.read_table(out)
    assert table.num_rows == 0 and "__joint_prob" in table.schema.names
    assert [n for n in table.schema.names if n.endswith("__changed_by_rules")] == [
        f"{n}__changed_by_rules" for n in FIELDS if n != "topic"]
    assert json.loads(table.schema.metadata[b"pcd.rules"]) == [r.to_dict() for r in schema_with(ISSUE_RULES).rules]
