"""A toy wire format for ``tests/server/test_toy_format.py``: what a new format is, one module of
the shape of ``pcd_cli/server/formats/`` (docs/architecture.md, "Where a new ... goes").

``POST /v1/toy`` ``{"text": str}`` labels the text with the served schema ``triage`` and answers
``{"labels": {field: value}, "input_tokens": int}``; its client reads the request id under
``x-toy-request-id`` and sends ``x-toy-client``. A body without a text string is an ``InputError``
(422 by the one error table); a record the decoder fails is ``RecordFailed`` (``Call.label_one``).
"""

from __future__ import annotations

from starlette.responses import Response
from starlette.routing import Route

from pcd_cli.errors import InputError
from pcd_cli.results import Record
from pcd_cli.server.errors import json_response
from pcd_cli.server.wire import Call, Server, WireFormat, route

REQUEST_ID_HEADER = "x-toy-request-id"
CLIENT_HEADER = "x-toy-client"


async def toy(call: Call) -> Response:
    """Label ``{"text"}`` with ``triage`` (module docstring)."""
    body = await call.body()
    text = body.get("text") if isinstance(body, dict) else None
    if not isinstance(text, str):
        raise InputError("text: must be a string")
    schema = call.service.named["triage"].schema
    result, submitted = await call.label_one(schema, Record(call.request_id, text))
    return json_response({"labels": {f.name: r.value for f, r in zip(schema.fields, result.fields)},
                          "input_tokens": submitted.input_tokens})


def routes(server: Server) -> list[Route]:
    """``POST /v1/toy``."""
    return [route(server, "/v1/toy", toy, "POST")]


FORMAT = WireFormat("toy", routes, request_id_headers=(REQUEST_ID_HEADER,), client_headers=frozenset({CLIENT_HEADER}))
