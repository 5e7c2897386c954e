"""The limits of ``pcd serve``, written once: ``cli.py``'s ``serve`` options take their defaults
from here, and so do ``AppConfig`` (the HTTP side) and ``ServiceConfig`` (the queue and the
decoder). No third-party import: the CLI reads it without the server extra installed.

Why each number is what it is: docs/serve.md, "Limits".
"""

#: Largest request body in bytes, after decompression (``--max-body-bytes``); larger is 413.
MAX_BODY_BYTES = 8 * 1024 * 1024
#: Most records in one ``/v1/label`` request, most questions in a Jev or OpenAI one
#: (``--max-records-per-request``); more is 413.
MAX_RECORDS_PER_REQUEST = 1024
#: Records waiting, not yet decoded, beyond which a request gets 429 (``--max-queued-records``).
MAX_QUEUED_RECORDS = 8192
#: Requests waiting beyond which a request gets 429 (``--max-queued-requests``).
MAX_QUEUED_REQUESTS = 1024
#: Labelers of request-built schemas kept, least recently used out (``--max-cached-schemas``).
MAX_CACHED_SCHEMAS = 64
#: Seconds from a request's arrival after which it is answered 503 ``deadline_exceeded``
#: (``--request-timeout-s``).
REQUEST_TIMEOUT_S = 60.0
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
