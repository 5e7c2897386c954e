"""The limits of ``pcd serve``, written once: ``cli.py``'s ``serve`` options take their defaults
from here, and so do ``AppConfig`` (the HTTP side) and ``ServiceConfig`` (the queue and the
decoder). No third-party import: the CLI reads it without the server extra installed.

Why each number is what it is: docs/serve.md, "Limits".
"""

#: Largest request body in bytes, after decompression (``--max-body-bytes``); larger is 413.
MAX_BODY_BYTES = 8 * 1024 * 1024
#: Most records one request puts in the queue (``--max-records-per-request``), one rule on every
#: route: a client that can split its request gets 413 beyond it (``/v1/label``'s records, a Jev or
#: OpenAI request's questions); Label Studio's ``/predict``, whose client sends every task a user
#: selected in one POST and cannot split them, is queued in slices of this many tasks, one slice
#: after the other under the request's one deadline.
MAX_RECORDS_PER_REQUEST = 1024
#: Records waiting, not yet decoded, beyond which a request gets 429 (``--max-queued-records``).
MAX_QUEUED_RECORDS = 8192
#: Requests waiting beyond which a request gets 429 (``--max-queued-requests``).
MAX_QUEUED_REQUESTS = 1024
#: Labelers of request-built schemas kept, least recently used out (``--max-cached-schemas``).
MAX_CACHED_SCHEMAS = 64
#: How long Label Studio waits for ``/predict`` (``ML_TIMEOUT_PREDICT`` in its
#: ``label_studio/ml/api_connector.py``, 1.23.2): past it Label Studio drops the answer.
LABEL_STUDIO_PREDICT_WAIT_S = 100.0
#: Seconds from a request's arrival after which it is answered 503 ``deadline_exceeded``
#: (``--request-timeout-s``): 90, below Label Studio's 100 s wait, so that its ``/predict`` gets
#: pcd's answer (or pcd's 503 saying how many tasks fit) rather than its own read timeout, and as
#: long as possible under it, so that a selection Label Studio would wait for is not given up early.
REQUEST_TIMEOUT_S = 90.0
#: Most estimated label tokens of a schema built from a request (``--max-compile-cost``); more
#: is 413 ``too_costly``.
MAX_COMPILE_COST = 8192
#: Largest request line plus header block in bytes (``--max-header-bytes``); larger is 431.
MAX_HEADER_BYTES = 64 * 1024
#: Most open connections (``--max-connections``); one more is 503 ``too_many_connections``.
MAX_CONNECTIONS = 1024
#: Most records in one decode call and most estimated tokens in it (packing).
MAX_BATCH_RECORDS = 64
MAX_BATCH_TOKENS = 16384
#: Estimated tokens (``service.estimate_tokens``) beyond which a record is long: it is decoded
#: alone, in a decode call of its own, and between its forward passes the worker decodes the
#: other requests' chunks, so one long record never holds up the short ones for more than one
#: of its passes (two passes' worth of tokens at the decoder's default 512 per pass).
LONG_RECORD_TOKENS = 1024
