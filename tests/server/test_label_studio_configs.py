"""Label Studio configs and results as Label Studio writes them (issue #45 kind 1), over the fake
host: ``<Choice alias>`` predicted and read back as Label Studio writes it (the case
``cases/ls-choice-alias-results.py``, copied unchanged from round 6, replayed here); objects and
controls pcd cannot serve refused at ``/setup`` with a 422 naming the tag and attribute; the mapping
``/setup`` made is the one the retrain's gold reader uses (control names, ``$content``, aliases);
``--template`` tasks as ``pcd review`` writes them retrain; a retrain that fails or is not started
says so in ``/versions`` and the webhook's answer; a task's text read by the CLI's value rule (737
is "737"), and a task without one gets no prediction rather than an invented score."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from pcd_cli.job import LabelJob  # noqa: E402
from pcd_cli.server.app import AppConfig  # noqa: E402
from pcd_cli.server.label_studio import LabelStudioConfig, MappingError, map_config  # noqa: E402

from ..helpers import FakeFit, retrained_labeler  # noqa: E402
from .harness import (AIRLINE, CASES, ROOT, SMS, TokenizingHost, check_nothing_left, label_studio_server,  # noqa: E402
                      port_of, serve)

BODIES = json.loads((Path(__file__).parent / "cases" / "label_studio" / "bodies.json").read_text())
CODE = {"NEGATIVE": "neg", "NEUTRAL": "neu", "POSITIVE": "pos"}
ALIAS_CODES = ('<View><Text name="text" value="$text"/><Choices name="sentiment" toName="text">'
               + "".join(f'<Choice value="{v}" alias="{a}"/>' for v, a in CODE.items()) + '</Choices></View>')
ALIAS_LABELS = ('<View><Text name="text" value="$text"/><Choices name="sentiment" toName="text">'
                + "".join(f'<Choice value="{v.title()} tweet" alias="{v}"/>' for v in CODE) + '</Choices></View>')
HAND_WRITTEN = ('<View><Text name="tweet" value="$content"/><Choices name="Mood" toName="tweet" choice="single">'
                '<Choice value="POSITIVE"/><Choice value="NEGATIVE"/><Choice value="NEUTRAL"/></Choices></View>')


@pytest.fixture
def ls(tmp_path):
    """``label_studio_server`` (a fake trainer, the default gold floor) with its state in
    ``tmp_path/state``; yields ``(server, backend, state folder)``."""
    with label_studio_server(tmp_path / "state") as server:
        yield server


def post(srv, path, body):
    return httpx.post(srv.url + path, json=body, timeout=30)


def setup(srv, project, xml):
    return post(srv, "/setup", {"project": f"{project}.1796425530", "schema": xml, "hostname": "http://127.0.0.1:9",
                                "access_token": "0" * 40, "extra_params": None})


def annotate(srv, project, tid, text, choices, *, control="sentiment", to_name="text", var="text"):
    body = {"action": "ANNOTATION_CREATED", "project": {"id": project},
            "task": {"id": tid, "data": {var: text}, "project": project},
            "annotation": {"id": 1000 + tid, "task": tid, "completed_by": 1, "was_cancelled": False,
                           "ground_truth": False, "created_at": "2026-12-04T23:05:32Z",
                           "result": [{"from_name": control, "to_name": to_name, "type": "choices",
                                       "value": {"choices": choices}}]}}
    return post(srv, "/webhook", body)


def train(srv, project):
    return post(srv, "/webhook", {"action": "START_TRAINING", "project": {"id": project}})


def dev_rows(n):
    lines = (ROOT / "sample_data" / "airline_tweets.dev.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines[:n]]


def test_case_choice_alias_results(ls):
    """The handed case, unchanged: a config whose aliases are the schema's labels maps; one whose
    aliases are codes predicts the codes (label-studio-sdk's validation passes) and its alias
    annotations are gold for the retrain."""
    srv, backend, state = ls
    done = subprocess.run([sys.executable, str(CASES / "ls-choice-alias-results.py"), str(port_of(srv)), str(state)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.startswith("PASS: "), done.stdout + done.stderr
    assert "predicted choices [['neg'], ['neg']]" in done.stdout or "predicted choices [['" in done.stdout
    # the 8 alias annotations are 8 gold rows of 'sentiment' (not "0 rows with gold labels")
    last = backend.histories["triage"].items[-1]
    assert (last.accepted, last.gold_rows) == (False, 8) and "field 'sentiment' 8" in last.reason


@pytest.mark.parametrize("xml, renamed", [(ALIAS_CODES, {"sentiment": CODE}), (ALIAS_LABELS, {})])
def test_alias_configs_predict_what_label_studio_writes_and_pass_its_validation(ls, xml, renamed):
    srv, _, _ = ls
    assert setup(srv, 61, xml).status_code == 200
    link = json.loads((ls[2] / "projects" / "61" / "link.json").read_text())
    assert link["mapping"]["fields"] == {"sentiment": "sentiment"} and link["mapping"]["choices"] == renamed
    tasks = [{"id": i, "data": {"text": t}} for i, t in enumerate(["@united lost my bag", "@united great crew"])]
    body = post(srv, "/predict", {"tasks": tasks, "project": "61.1796425530", "label_config": xml}).json()
    written = set(CODE.values()) if renamed else set(CODE)
    for result in body["results"]:
        (item,) = result["result"]
        assert item["value"]["choices"][0] in written
        assert set(item["meta"]["probs"]) == set(CODE)  # the distribution stays by the schema's labels
    sdk = pytest.importorskip("label_studio_sdk.label_interface")
    interface = sdk.LabelInterface(xml)
    assert [interface.validate_prediction(r, return_errors=True) for r in body["results"]] == [[], []]


def test_alias_annotations_reach_the_trainer_as_the_schema_labels(ls):
    srv, backend, _ = ls
    setup(srv, 62, ALIAS_CODES)
    rows = dev_rows(10)
    for i, row in enumerate(rows):
        assert annotate(srv, 62, i + 1, row["text"], [CODE[row["sentiment"]]]).status_code == 200
    assert train(srv, 62).json()["training"] == "started"
    backend.wait_training(30)
    (method, tasks), = backend.fit.calls
    assert [t["annotations"][0]["result"][0]["value"]["choices"] for t in tasks] == [[r["sentiment"]] for r in rows]
    assert backend.histories["triage"].items[-1].accepted


def test_a_hand_written_config_retrains_through_the_mapping_setup_made(ls):
    """``Mood`` -> ``sentiment``, ``$content``: the trainer reads results named after the field and
    the text under ``text`` (was: "no field has a gold column")."""
    srv, backend, _ = ls
    assert setup(srv, 63, HAND_WRITTEN).status_code == 200
    rows = dev_rows(10)
    for i, row in enumerate(rows):
        annotate(srv, 63, i + 1, row["text"], [row["sentiment"]], control="Mood", to_name="tweet", var="content")
    assert train(srv, 63).json()["training"] == "started"
    backend.wait_training(30)
    (_, tasks), = backend.fit.calls
    assert {r["from_name"] for t in tasks for a in t["annotations"] for r in a["result"]} == {"sentiment"}
    assert [t["data"]["text"] for t in tasks] == [r["text"] for r in rows]
    assert backend.histories["triage"].items[-1].accepted


@pytest.mark.parametrize("xml, named", [
    ('<View><Text name="text" value="$url" valueType="url"/><Choices name="sentiment" toName="text">'
     '<Choice value="NEGATIVE"/><Choice value="NEUTRAL"/><Choice value="POSITIVE"/></Choices></View>',
     "valueType='url'"),
    ('<View><HyperText name="text" value="$html"/><Choices name="sentiment" toName="text">'
     '<Choice value="NEGATIVE"/><Choice value="NEUTRAL"/><Choice value="POSITIVE"/></Choices></View>', "<HyperText"),
    ('<View><Paragraphs name="text" value="$dialogue" layout="dialogue"/><Choices name="sentiment" toName="text">'
     '<Choice value="NEGATIVE"/><Choice value="NEUTRAL"/><Choice value="POSITIVE"/></Choices></View>', "<Paragraphs"),
    ('<View><Labels name="label" toName="text"><Label value="PER"/></Labels><Text name="text" value="$text"/>'
     '<Choices name="sentiment" toName="text" perRegion="true"><Choice value="NEGATIVE"/><Choice value="NEUTRAL"/>'
     '<Choice value="POSITIVE"/></Choices></View>', 'perRegion="true"'),
    ('<View><Text name="text" value="$text"/><Choices name="sentiment" toName="text" value="$options"/></View>',
     "value='$options'"),
    ('<View><Image name="img" value="$image"/><Choices name="sentiment" toName="img"><Choice value="NEGATIVE"/>'
     '<Choice value="NEUTRAL"/><Choice value="POSITIVE"/></Choices></View>', "<Image"),
    ('<View><Text name="text" value="static words"/><Choices name="sentiment" toName="text"><Choice value="NEGATIVE"/>'
     '<Choice value="NEUTRAL"/><Choice value="POSITIVE"/></Choices></View>', 'value="$key"'),
])
def test_setup_refuses_what_pcd_cannot_serve_naming_the_tag(ls, xml, named):
    srv, _, _ = ls
    r = setup(srv, 64, xml)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "label_config_not_mapped" and named in error["message"], error["message"]
    # and /predict with the same config in its body (no /setup) is refused the same way
    r = post(srv, "/predict", {"tasks": [{"id": 1, "data": {"text": "x"}}], "project": "65.1", "label_config": xml})
    assert r.status_code == 422 and named in r.json()["error"]["message"]


def test_other_controls_beside_choices_are_left_to_the_annotators():
    xml = ('<View><Text name="text" value="$text"/><TextArea name="note" toName="text"/>'
           '<Choices name="sentiment" toName="text"><Choice value="NEGATIVE"/><Choice value="NEUTRAL"/>'
           '<Choice value="POSITIVE"/></Choices></View>')
    mapping = map_config(xml, {"triage": AIRLINE, "sms": SMS})
    assert (mapping.fields, mapping.text_var) == ({"sentiment": "sentiment"}, "text")


def test_an_alias_set_that_matches_no_field_is_refused_naming_the_control():
    xml = ('<View><Text name="text" value="$text"/><Choices name="sentiment" toName="text">'
           '<Choice value="bad" alias="b"/><Choice value="good" alias="g"/></Choices></View>')
    with pytest.raises(MappingError, match="no field for control 'sentiment'"):
        map_config(xml, {"triage": AIRLINE, "sms": SMS})


def test_task_text_is_read_by_the_cli_value_rule_and_a_task_without_text_gets_no_prediction(ls):
    srv, _, _ = ls
    setup(srv, 66, BODIES["setup"]["schema"])
    tasks = [{"id": 1, "data": {"text": 737}}, {"id": 2, "data": {"text": None}}, {"id": 3, "data": {"text": [1]}},
             {"id": 4, "data": {"text": True}}, {"id": 5, "data": {}}, {"id": 6, "data": {"text": " fine\n"}},
             {"id": 7, "data": {"text": "   "}}]
    answer = post(srv, "/predict", {"tasks": tasks, "project": "66.1796425530"}).json()
    decoded = [text for _, text in srv.service.host.calls[-1] if text is not None]
    assert decoded == ["737", "true", "fine"]  # as pcd label reads them (JSON spelling, stripped)
    results = answer["results"]
    assert len(results) == 7 and results[1] == results[2] == results[4] == results[6] == []
    assert all(r["result"] for r in (results[0], results[3], results[5]))
    assert answer["errors"] == [
        {"task": 2, "index": 1, "error": "task 2: text field 'text' is missing or null"},
        {"task": 3, "index": 2, "error": "task 3: text field 'text' is a list, not a string"},
        {"task": 5, "index": 4, "error": "task 5: text field 'text' is missing or null"},
        {"task": 7, "index": 6, "error": "task 7: the text is empty"}]


def test_a_template_server_retrains_on_the_tasks_pcd_review_wrote(tmp_path):
    """``pcd serve --template '{subject}: {body}' --label-studio``: ``pcd review --template`` writes
    the composed text under ``data.text``; the retrain reads that text as it is (was: ``no column
    'subject'``) and the swapped-in job keeps serving through the template."""
    before = {t.ident for t in threading.enumerate()}
    template = "{subject}: {body}"
    host = TokenizingHost()
    config = AppConfig(label_studio=LabelStudioConfig(state_dir=str(tmp_path)))
    with serve(host, app_config=config, schemas={"triage": (AIRLINE, LabelJob(template=template))}) as srv:
        backend = srv.server.config.app.state.label_studio
        backend.fit = FakeFit({"accuracy": 0.5, "nll": 1.0}, {"accuracy": 0.75, "nll": 0.8})
        backend.build = lambda schema, job, own: retrained_labeler(schema, job, host)
        setup(srv, 67, BODIES["setup"]["schema"])
        rows = dev_rows(10)
        for i, row in enumerate(rows):
            annotate(srv, 67, i + 1, f"Flight: {row['text']}", [row["sentiment"]])
        assert train(srv, 67).json()["training"] == "started"
        backend.wait_training(30)
        (_, tasks), = backend.fit.calls
        assert tasks[0]["data"]["text"] == f"Flight: {rows[0]['text']}"
        last = backend.histories["triage"].items[-1]
        assert last.accepted and "template" not in last.job, last
        assert srv.service.named["triage"].options.template == template
        r = post(srv, "/v1/label", {"schema": "triage", "records": [{"subject": "Bags", "body": "lost again"}]})
        assert r.status_code == 200 and host.calls[-1][0][1] == "Bags: lost again"
    check_nothing_left(before)


def test_a_failed_retrain_and_a_refused_one_say_why_in_versions_and_the_answer(ls):
    srv, backend, _ = ls
    setup(srv, 68, BODIES["setup"]["schema"])
    for i, row in enumerate(dev_rows(3)):
        annotate(srv, 68, i + 1, row["text"], [row["sentiment"]])
    answer = train(srv, 68).json()
    assert answer["training"] == "not_enough_gold" and "field 'sentiment' 3" in answer["reason"]
    assert "at least 10" in answer["reason"]
    for i, row in enumerate(dev_rows(10)[3:]):
        annotate(srv, 68, i + 4, row["text"], [row["sentiment"]])

    def broken(*a, **k):
        raise RuntimeError("the trainer fell over")

    backend.fit = broken
    answer = train(srv, 68).json()
    assert answer["training"] == "started" and "field 'sentiment' 3" in answer["previous_run"]["reason"]
    backend.wait_training(30)
    history = httpx.get(srv.url + "/versions", timeout=10).json()["schemas"]["triage"]["history"]
    assert [(v["accepted"], v["gold_rows"]) for v in history[-2:]] == [(False, 3), (False, 10)]
    assert history[-1]["version"].startswith("failed-") and history[-1]["reason"] == "RuntimeError: the trainer fell over"
    # the failure happened after its trigger was answered: the next trigger's answer carries it
    backend.fit = FakeFit({"accuracy": 0.5, "nll": 1.0}, {"accuracy": 0.75, "nll": 0.8})
    answer = train(srv, 68).json()
    assert answer["training"] == "started"
    assert answer["previous_run"] == {"version": history[-1]["version"], "method": "calibrate",
                                      "reason": "RuntimeError: the trainer fell over"}
    backend.wait_training(30)
    assert "previous_run" not in train(srv, 68).json()  # the last run was swapped in



BOOLEAN_ALIAS = ('<View><Text name="msg" value="$sms"/><Choices name="spam" toName="msg">'
                 '<Choice value="true" alias="spam"/><Choice value="false" alias="ham"/></Choices></View>')


@pytest.mark.parametrize("xml, schema, control, written", [
    (HAND_WRITTEN, "triage", "Mood", set(CODE)),
    (BOOLEAN_ALIAS, "sms", "spam", {"spam", "ham"}),
])
def test_every_mapped_config_predicts_what_label_studio_validates(ls, xml, schema, control, written):
    srv, backend, _ = ls
    assert setup(srv, 69, xml).status_code == 200
    assert backend.links["69"].mapping.schema == schema
    var = backend.links["69"].mapping.text_var
    tasks = [{"id": i, "data": {var: t}} for i, t in enumerate(["WIN a prize now", "see you at 6"])]
    results = post(srv, "/predict", {"tasks": tasks, "project": "69.1796425530"}).json()["results"]
    assert {r["result"][0]["from_name"] for r in results} == {control}
    assert {r["result"][0]["value"]["choices"][0] for r in results} <= written
    sdk = pytest.importorskip("label_studio_sdk.label_interface")
    interface = sdk.LabelInterface(xml)
    assert [interface.validate_prediction(r, return_errors=True) for r in results] == [[], []]
