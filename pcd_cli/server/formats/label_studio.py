"""The Label Studio ML backend wire format (``pcd serve --label-studio``): ``POST /setup``,
``/predict``, ``/webhook``, ``/train`` and ``GET /versions``; ``/health`` is the server's own.

What each route reads and answers, and what Label Studio 1.23.2 sends: ``server/label_studio.py``'s
module docstring. This module is the wire only: each handler reads the body into what the
backend (``label_studio.LabelStudioBackend``: project links, the gold journal, retraining,
versions) needs, and renders what it returns. ``/predict`` submits through the ``Call`` (the
deadline counted from the request's arrival, as every format) and builds each prediction from the
typed ``RecordResult`` (``prediction``).
"""

from __future__ import annotations

import asyncio

import numpy as np
from starlette.responses import Response
from starlette.routing import Route

from ...io.output import chosen_options
from ...io.readers import InputSpec, row_to_record
from ...results import Record, RecordFailure, RecordResult
from ...schema.model import Field, Schema
from ..errors import ApiError, json_response
from ..label_studio import (ANNOTATION_ACTIONS, DELETE_ACTIONS, ConfigMapping, LabelStudioBackend, map_config,
                            project_id)
from ..service_errors import DeadlineExceeded
from ..wire import Call, Server, WireFormat, route


def _invalid(message: str, code: str = "invalid_request") -> ApiError:
    return ApiError(422, "invalid_request_error", code, message)


async def _body(call: Call, backend: LabelStudioBackend) -> dict:
    body = await call.body()
    if not isinstance(body, dict):
        raise _invalid("the body must be a JSON object")
    if backend.recorded is not None:
        backend.recorded.append((call.request.url.path, body))
    return body


def _f32(x: float) -> float:
    """``x`` as the float32 ``pcd label`` writes (and ``/v1/label`` answers)."""
    return float(np.float32(x))


def field_answer(f: Field, part: tuple[int, ...], result: RecordResult) -> tuple[list[str] | None, float, dict]:
    """One declared field of one record, as Label Studio takes it: ``(choices, probability of the
    choice, {label: probability})``; choices ``None`` where the field abstained.

    Choices follow ``pcd review``'s labels: booleans ``true``/``false``, integers their digits, a
    nullable field's null its null label, a multi-select field its chosen options (probability:
    the product of P(yes) or P(no) over its options, as ``<f>__prob``). Numbers are float32, as
    ``pcd label`` writes them."""
    if f.is_multi:
        p_yes = [result.fields[d].probs[0] for d in part]
        chosen = set(chosen_options(f, p_yes))
        prob = float(np.prod([p if i in chosen else 1 - p for i, p in enumerate(p_yes)]))
        return [f.labels[i] for i in sorted(chosen)], _f32(prob), {l: _f32(p) for l, p in zip(f.labels, p_yes)}
    fr = result.fields[part[0]]
    probs = {str(l): _f32(p) for l, p in zip(f.labels, fr.probs)}
    value = fr.value
    if value is None:
        choices = [f.labels[-1]] if getattr(f, "nullable", False) and not fr.abstained else None
    elif isinstance(value, bool):
        choices = ["true" if value else "false"]
    else:
        choices = [str(value)]
    return choices, _f32(fr.prob), probs


def prediction(result: RecordResult | RecordFailure, schema: Schema, mapping: ConfigMapping,
               version: str) -> dict | list:
    """One task's prediction: per mapped field a ``choices`` result, its choices written as Label
    Studio writes them (``ConfigMapping.written``: a ``<Choice alias>`` when the config has one),
    the label's probability as ``score`` and the full distribution (by the field's labels) under
    ``meta.probs``; the task's ``score`` the review score (the lowest chosen-label probability
    over the fields, as ``pcd review`` orders).

    A task without a result (no text, or a failed record) gets no prediction: an empty list,
    which Label Studio's ML client reads as "no prediction for this task" (``MLBackend.
    _get_predictions_from_ml_backend`` takes a list per task and stores each item), so the count
    of results still matches the tasks and no invented score (0.0 would be served first by
    uncertainty sampling) is stored; the reason is in the response's ``errors``."""
    if not isinstance(result, RecordResult):
        return []
    parts = {f.name: (f, part) for f, part in schema.declared_parts()}
    items, probs = [], []
    for control, name in mapping.fields.items():
        choices, prob, dist = field_answer(*parts[name], result)
        probs.append(prob)
        if choices is None:
            continue
        items.append({"from_name": control, "to_name": mapping.to_name, "type": "choices",
                      "value": {"choices": [mapping.written(control, c) for c in choices]}, "score": prob,
                      "meta": {"probs": dist}})
    return {"result": items, "score": float(min(probs)) if probs else 0.0, "model_version": version}


def task_record(i: int, task: object, mapping: ConfigMapping) -> Record | RecordFailure:
    """Task ``i`` of a ``/predict`` body as a record, by the readers' own row rule
    (``pcd_cli.io.readers.row_to_record`` over the task's ``data`` with the config's text
    variable as the text field): a number or boolean in its JSON spelling (``737`` -> ``"737"``,
    as ``pcd label`` and ``/v1/label`` read it), surrounding whitespace stripped; a failure naming
    the task when the text is missing, null, empty or not a scalar."""
    tid = task.get("id", i) if isinstance(task, dict) else i
    data = task.get("data") if isinstance(task, dict) else None
    out = row_to_record(data if isinstance(data, dict) else {}, i, None,
                        InputSpec(text_field=mapping.text_var, id_field=None))
    if isinstance(out, RecordFailure):
        reason = out.error.split(": ", 1)[-1]  # the reader's "row i: " becomes the task's name
        return RecordFailure(str(i), f"task {tid!r}: {reason}", row=i)
    return Record(str(i), out.text, row=i)


def routes(server: Server) -> list[Route]:
    """The Label Studio routes over a ``LabelStudioBackend`` of ``server`` (none when the server
    was not started with ``--label-studio``); the backend is ``server.label_studio``."""
    backend = server.label_studio
    if backend is None:
        return []

    async def setup(call: Call) -> Response:
        """``POST /setup``: map the project's config to a served schema (``map_config``; 422 naming
        what does not map), remember the project (its token in memory only); answers
        ``{"model_version"}``, the schema's current version."""
        body = await _body(call, backend)
        project = project_id(body.get("project"))
        schema_xml = body.get("schema") or body.get("label_config")
        if project is None or not isinstance(schema_xml, str):
            raise _invalid("/setup needs 'project' (\"<id>.<created>\") and 'schema' (the label config XML)")
        mapping = map_config(schema_xml, {n: e.schema for n, e in call.service.named.items()})
        version = await backend.setup(project, mapping, str(body.get("hostname") or ""),
                                      str(body.get("access_token") or ""))
        return json_response({"model_version": version})

    async def predict(call: Call) -> Response:
        """``POST /predict``: the tasks through the packing worker (``Call.submit``: the deadline
        counts from the request's arrival), in slices of ``--max-records-per-request`` tasks one
        after the other; one prediction per task, in order, each with the version that decoded it."""
        body = await _body(call, backend)
        tasks = body.get("tasks")
        if not isinstance(tasks, list):
            raise _invalid("/predict needs 'tasks', a list")
        mapping = backend.link(project_id(body.get("project")), body.get("label_config")).mapping
        schema = call.service.named[mapping.schema].schema
        records = [task_record(i, task, mapping) for i, task in enumerate(tasks)]
        decoded, results, version = [], [], backend.version_of(mapping.schema, None)
        # --max-records-per-request (limits.MAX_RECORDS_PER_REQUEST): Label Studio cannot split the
        # tasks a user selected, so they are queued in slices of that many, one after the other,
        # under the request's one deadline (a 503 counts the tasks of every slice decoded)
        most = max(1, int(call.config.max_records_per_request))
        for start in range(0, len(records), most):
            try:
                submitted = await call.submit(schema, records[start:start + most])
            except DeadlineExceeded as exc:
                raise exc.counted(start, len(records), "tasks") from None
            version = backend.version_of(mapping.schema, submitted.labeler)  # the model that decoded them
            decoded += submitted.results
            results += [prediction(r, schema, mapping, version) for r in submitted.results]
        errors = [{"task": t.get("id") if isinstance(t, dict) else None, "index": i, "error": r.error}
                  for i, (t, r) in enumerate(zip(tasks, decoded)) if isinstance(r, RecordFailure)]
        return json_response({"results": results, "model_version": version, **({"errors": errors} if errors else {})})

    async def webhook(call: Call) -> Response:
        """``POST /webhook``: an annotation event, or a deletion (``DELETE_ACTIONS``: annotations,
        tasks, the project), is appended to the project's journal (the only work before
        answering; a journal that cannot be written is answered 503 naming it and the reason);
        ``START_TRAINING`` starts a retrain (``training_answer``: with the reason when there is
        not enough gold); other actions are answered ``ignored``. Answers 200 ``{"status", ...}``."""
        body = await _body(call, backend)
        action = body.get("action")
        project = project_id(body.get("project"))
        if project is None and isinstance(body.get("task"), dict):
            project = project_id(body["task"].get("project"))
        if action in ANNOTATION_ACTIONS or action in DELETE_ACTIONS:
            if project is None:
                raise _invalid(f"{action}: no project in the body")
            n, not_kept = await asyncio.to_thread(backend.journal_event, project, action, body)
            if not_kept and not n:  # nothing of it kept: say so (never a silent 200)
                raise _invalid(f"{action}: no annotation kept: " + "; ".join(
                    f"annotation {d['annotation']!r}: {d['reason']}" for d in not_kept), "annotation_not_kept")
            status = await asyncio.to_thread(backend.maybe_retrain, project) if action in ANNOTATION_ACTIONS \
                else None
            return json_response({"status": "ok", "action": action, "events": n, "training": status,
                                  **({"not_kept": not_kept} if not_kept else {})})
        if action == "START_TRAINING":
            if project is None:
                raise _invalid("START_TRAINING: no project")
            answer = await asyncio.to_thread(backend.training_answer, project)
            return json_response({"status": "ok", "action": action, **answer})
        return json_response({"status": "ignored", "action": action})

    async def train(call: Call) -> Response:
        """``POST /train`` (older Label Studio): every annotated task's annotations go to the
        journal, then a retrain starts; answers 201 ``{"training": ...}``."""
        body = await _body(call, backend)
        project = project_id(body.get("project"))
        tasks = body.get("annotations")
        if project is None or not isinstance(tasks, list):
            raise _invalid("/train needs 'project' and 'annotations' (the annotated tasks)")
        if project not in backend.links and isinstance(body.get("label_config"), str):
            backend.link(project, body["label_config"])
        n = await asyncio.to_thread(backend.journal_tasks, project, tasks)
        return json_response({"events": n, **await asyncio.to_thread(backend.training_answer, project)}, 201)

    async def versions(call: Call) -> Response:
        """``GET /versions``: ``{"versions": [the accepted version names, oldest first], "schemas":
        {name: {"current", "history": [Version...]}}}``."""
        return json_response(backend.versions())

    return [route(server, "/setup", setup, "POST"), route(server, "/predict", predict, "POST"),
            route(server, "/webhook", webhook, "POST"), route(server, "/train", train, "POST"),
            route(server, "/versions", versions, "GET")]


#: The Label Studio ML backend's format (mounted only with ``--label-studio``).
FORMAT = WireFormat("label_studio", routes)
