"""pcd's own wire format: ``POST /v1/label`` (rows with the columns and values of ``pcd label``'s
Parquet output) and ``GET /v1/schemas`` (the served schemas).

* Request: ``{"schema": NAME, "records": [text | {"id", "text", ...}], "all_probs": bool}``.
  Records become ``pcd_cli.results.Record`` values by ``pcd label``'s rules (the schema's
  ``text_field`` or ``template``; an ``id`` key on any record object makes ``id`` the id column,
  else ids are positions in a ``row`` column).
* Response: ``rows`` (exactly ``pcd label``'s Parquet columns and values; ``<f>__probs`` as an
  object), ``errors`` (``{row, record, error}`` with the CLI's messages), ``metadata`` (the Parquet
  ``pcd.*`` keys) and ``usage``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from starlette.responses import Response
from starlette.routing import Route

from ...errors import PcdError
from ...io.output import check_columns, results_table
from ...io.readers import DEFAULT_ID_COLUMN, InputSpec, row_to_record
from ...results import Record, RecordFailure, RecordResult
from ...schema.model import Schema
from ..errors import ApiError, json_response
from ..service import SubmitResult
from ..wire import Call, Server, WireFormat, route

#: The keys of a ``/v1/label`` body.
KEYS = ("schema", "records", "all_probs")


@dataclass(frozen=True)
class LabelRequest:
    """A ``/v1/label`` body, read: the served schema, its records, and how to render them."""

    schema: Schema
    records: list[Record | RecordFailure]
    column: str  # the id column: "id" when a record carries one, else "row"
    all_probs: bool


def parse_label(body: object, call: Call) -> LabelRequest:
    """A ``/v1/label`` body -> ``LabelRequest``.

    Raises:
        ApiError: 422 ``invalid_request`` naming the key (not an object, an unknown key, a bad
            ``schema``/``records``/``all_probs``, an id column that clashes); 422
            ``unknown_schema``; 413 ``too_many_records`` over ``--max-records-per-request``.
    """
    if not isinstance(body, dict):
        raise _invalid("the body must be a JSON object {\"schema\": NAME, \"records\": [...]}")
    unknown = [k for k in body if k not in KEYS]
    if unknown:
        raise _invalid(f"unknown key {unknown[0]!r}; the keys are schema, records, all_probs")
    name, records, all_probs = body.get("schema"), body.get("records"), body.get("all_probs", False)
    if not isinstance(name, str):
        raise _invalid("'schema' must be the name of a served schema (GET /v1/schemas)")
    entry = call.service.named.get(name)
    if entry is None:
        raise ApiError(422, "invalid_request_error", "unknown_schema",
                       f"schema {name!r} is not served; served: {', '.join(sorted(call.service.named)) or 'none'}")
    if not isinstance(records, list):
        raise _invalid("'records' must be a list of texts or {\"id\", \"text\", ...} objects")
    most = call.config.max_records_per_request
    if len(records) > most:
        raise ApiError(413, "invalid_request_error", "too_many_records",
                       f"{len(records)} records in one request; at most {most} (--max-records-per-request): split it")
    if not isinstance(all_probs, bool):
        raise _invalid("'all_probs' must be true or false")
    options = entry.options
    has_id = any(isinstance(r, dict) and DEFAULT_ID_COLUMN in r for r in records)
    try:
        spec = InputSpec(text_field=options.text_field, template=options.template,
                         id_field=DEFAULT_ID_COLUMN if has_id else None)
        column = DEFAULT_ID_COLUMN if has_id else "row"
        check_columns(entry.schema, column, all_probs=all_probs)
    except PcdError as exc:
        raise _invalid(str(exc)) from None
    # a JSON null record is an error of its row (null answers, never an invented probability)
    items = [RecordFailure(None if has_id else i, f"row {i}: the record is null; give a text or an object", row=i)
             if r is None else row_to_record(r if isinstance(r, dict) else _text_row(r, spec), i, None, spec)
             for i, r in enumerate(records)]
    return LabelRequest(entry.schema, items, column, all_probs)


def _text_row(value: object, spec: InputSpec) -> dict:
    """A record given as a bare value: the text itself (through the template's only column, or
    the text field)."""
    if spec.template is not None:
        cols = [c for c in spec.columns_needed() if c != spec.id_field]
        return {c: value for c in cols[:1]}
    return {spec.text_field: value}


def render_label(submitted: SubmitResult, req: LabelRequest) -> dict:
    """The ``/v1/label`` response body: rows built with the CLI's own ``output_schema`` and
    ``results_table`` (so the columns, types and values are the Parquet file's), errors, metadata, usage."""
    labelled = [r for r in submitted.results if isinstance(r, RecordResult)]
    rows: list[dict] = []
    if labelled:
        id_type = pa.string() if req.column == DEFAULT_ID_COLUMN else pa.int64()
        arrow_schema = submitted.labeler.output_schema(req.column, id_type, all_probs=req.all_probs)
        rows = results_table(labelled, req.schema, arrow_schema).to_pylist()
        maps = [f.name for f in arrow_schema if pa.types.is_map(f.type)]
        for row in rows:
            for name in maps:
                if row[name] is not None:
                    row[name] = dict(row[name])
    errors = [{"row": i, "record": r.id, "error": r.error} for i, r in enumerate(submitted.results)
              if not isinstance(r, RecordResult)]
    truncated = sum(bool(r.truncated) for r in labelled)
    metadata = dict(submitted.labeler_metadata) | {
        "pcd.records_read": str(len(req.records)), "pcd.records_labelled": str(len(labelled)),
        "pcd.records_failed": str(len(errors)), "pcd.records_truncated": str(truncated)}
    return {"rows": rows, "errors": errors, "metadata": metadata,
            "usage": {"records": len(req.records), "input_tokens": int(submitted.input_tokens),
                      "queue_ms": round(float(submitted.queue_ms), 3), "decode_ms": round(float(submitted.decode_ms), 3)}}


def _invalid(message: str) -> ApiError:
    return ApiError(422, "invalid_request_error", "invalid_request", message)


async def label(call: Call) -> Response:
    """``POST /v1/label`` (module docstring)."""
    req = parse_label(await call.body(text_checked_by_caller=("records",)), call)
    return json_response(render_label(await call.submit(req.schema, req.records), req))


async def schemas(call: Call) -> Response:
    """``GET /v1/schemas``: the served schemas (names, fields, labels, schema and prompt-head sha256)."""
    return json_response({"model": call.service.model_id, "schemas": call.service.schema_info()})


def routes(server: Server) -> list[Route]:
    """``POST /v1/label`` and ``GET /v1/schemas``."""
    return [route(server, "/v1/label", label, "POST"), route(server, "/v1/schemas", schemas, "GET")]


#: pcd's own format: its routes; the request id under ``x-request-id`` only.
FORMAT = WireFormat("pcd", routes)
