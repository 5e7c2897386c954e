"""The label service: one worker thread owns the model and packs concurrent requests into
shared decode calls; a compile thread builds the labelers of request-built schemas beside it.

The HTTP event loop only calls ``LabelService.submit`` (an ``async`` method that checks a
request's text, queues it and waits for its results); model code runs on the service's two
threads: the worker loads the backend, compiles the startup schemas, decodes and counts tokens;
the compile thread (``pcd-compile-worker``) compiles each new question set, so that a long
compile never holds up decoding for schemas already compiled. A queued request whose schema is
not compiled yet waits for it; one past its deadline (or whose client left) is dropped before
its compile, between compile and decode, and between chunks.

Packing (``ServiceConfig.packing``, on by default): a request is cut into chunks of
``chunk_records`` records counted from its first record (the chunks ``pcd label`` hands to the
decoder, ``pcd_cli.engines.local.CHUNK_RECORDS``). The worker takes the oldest queued request's
next chunk, then the next chunk of each later request for the same labeler, oldest first, while
the batch stays within ``max_batch_records`` records and ``max_batch_tokens`` estimated tokens,
and decodes them in ONE ``Labeler.label_batch`` call; the results are split back. A request with
chunks left goes to the back of the queue, so a one-record request queued behind a 1,000-record
one waits for one chunk, not for the whole request. Requests for different labelers (schemas or
options) are never packed together. A batch holding a single chunk is exactly the call
``pcd label`` makes, so a request alone on an idle server gets ``pcd label``'s results bit for bit;
under packing, labels agree and probabilities move within the decoder's packed-vs-single bound
(docs/serve.md). With packing off, every batch is one chunk of one request.

Long records (``ServiceConfig.long_record_tokens``, ``limits.LONG_RECORD_TOKENS``): a record
estimated longer is never packed; it is decoded alone, in a decode call of its own, on the
entry's spare labeler (the same compiled schema and model, its own head cache), and between two
of its forward passes the worker decodes one batch of the other queued requests' short records on
the entry's labeler. A short request queued behind a long record therefore waits for at most one
of the long record's passes per batch, not for the whole record (a 79 kB ticket is 17 passes).

Deadlines: a request past its deadline is answered 503 at the deadline, saying how many of its
records were decoded (results delivered, not records taken). A decode call still running for it
is abandoned before its next forward pass once no request in it is live any more: at most the
pass in flight runs after the answer, and its results are dropped and never counted
(``pcd_records_total`` counts records whose decode call completed).

Queue room (``max_queued_requests``, ``max_queued_records``): requests waiting for a decode call
are counted; a request whose question set is still compiling is not queueing, and is bounded
apart by the same numbers, so a slow compile never takes the room of a served schema's request.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import math
import threading
import time
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Awaitable, Callable, Sequence

from ..engines.local import CHUNK_RECORDS
from ..errors import PcdError
from ..job import LabelJob, schema_warnings
from ..results import Record, RecordFailure
from ..schema.model import Schema
from . import limits, textcheck
from .errors import ClientDisconnected, log_crash
from .service_errors import (CompileFailed, DeadlineExceeded, DecodeFailed, Draining, InvalidOption, InvalidText,
                             NotCompilable, NotReady, QueueFull, Refused, ServiceError, ShuttingDown, TooCostly)

if TYPE_CHECKING:
    from ..api import Labeler

log = logging.getLogger("pcd.server")

#: Seconds between two looks at a waiting request's connection and deadline.
POLL_S = 0.1


class ModelHost:
    """The model, loaded once, and the labelers built over it (one per schema and job).

    ``load`` and ``labeler`` run on the service's worker thread only.

    Args:
        job: the served job (``pcd serve``'s options): its ``model``, ``backend``, ``device``,
            ``dtype`` and ``adapter`` say what to load (``pcd_cli.api.load_model``); each schema's
            labeler is built from its own job by ``pcd_cli.api.build_labeler``.
        loaded: an already loaded backend (tests); the job's model options are then ignored.
    """

    def __init__(self, job: LabelJob | None = None, *, loaded=None):
        self.job = job or LabelJob()
        self.backend = loaded
        #: the adapter's warnings, said once at load
        self.warnings: list = []

    @property
    def model(self) -> str | None:
        """The ``--model`` given (``None``: the embedded model)."""
        return self.job.model

    @property
    def model_id(self) -> str:
        """The loaded model's id (``backend.model_id``); the ``--model`` given before loading."""
        if self.backend is not None:
            return self.backend.model_id
        return self.job.model or "embedded"

    def load(self) -> str:
        """Load the backend (once) and merge the adapter; returns the model id.

        Raises:
            ModelError: the model cannot be loaded (see ``pcd_cli.backends.load_backend``).
        """
        if self.backend is None:
            from ..api import load_model

            self.backend, self.warnings = load_model(self.job)
        return self.backend.model_id

    def labeler(self, schema: Schema, options: LabelJob):
        """A ``Labeler`` for ``schema`` and its job over the loaded model (shared, not copied):
        ``build_labeler``, so a served schema gets what ``pcd label`` with the same options
        gets, the adapter folder's calibration and tune card included.

        Raises:
            SchemaError, CompileError, CalibrationError: as ``Labeler``.
        """
        from ..api import build_labeler

        return build_labeler(schema, options, backend=self.backend)


@dataclass(frozen=True)
class ServiceConfig:
    """Limits and packing of a ``LabelService``.

    Attributes:
        packing: pack chunks of concurrent requests into one decode call (``--no-packing``: off).
        chunk_records: records of one request taken at a time (``pcd label``'s chunk).
        max_batch_records: most records in one decode call.
        max_batch_tokens: most estimated tokens (``estimate_tokens``) in one decode call; the
            first chunk is always taken.
        max_queued_records: records waiting (not yet decoded) beyond which a request gets 429.
        max_queued_requests: requests waiting beyond which a request gets 429.
        max_cached_schemas: labelers of request-built schemas kept (least recently used out);
            the startup schemas are pinned and not counted.
        request_timeout_s: a request not answered this long after it arrived gets 503
            (``None``: no deadline).
        max_compile_cost: most estimated label tokens (``textcheck.compile_cost``: options ×
            tokens) of a schema built from a request; more is 413 ``too_costly``, refused before
            anything is compiled (startup schemas are not bounded).
        long_record_tokens: estimated tokens beyond which a record is decoded alone and the
            other requests' chunks are decoded between its forward passes (module doc).
    """

    packing: bool = True
    chunk_records: int = CHUNK_RECORDS
    max_batch_records: int = limits.MAX_BATCH_RECORDS
    max_batch_tokens: int = limits.MAX_BATCH_TOKENS
    max_queued_records: int = limits.MAX_QUEUED_RECORDS
    max_queued_requests: int = limits.MAX_QUEUED_REQUESTS
    max_cached_schemas: int = limits.MAX_CACHED_SCHEMAS
    request_timeout_s: float | None = limits.REQUEST_TIMEOUT_S
    max_compile_cost: int = limits.MAX_COMPILE_COST
    long_record_tokens: int = limits.LONG_RECORD_TOKENS


class _Abandoned(Exception):
    """Raised between two forward passes of a decode call none of whose requests is live any more."""


def estimate_tokens(record: Record | RecordFailure) -> int:
    """A record's tokens for the batch budget, estimated without the tokenizer (which belongs to
    the worker): a quarter of its UTF-8 bytes plus 8, 1 for a failure."""
    if isinstance(record, RecordFailure):
        return 1
    return len(record.text.encode("utf-8", "surrogatepass")) // 4 + 8


@dataclass
class SubmitResult:
    """What ``LabelService.submit`` returns.

    Attributes:
        results: one ``RecordResult`` or ``RecordFailure`` per input record, in input order.
        labeler_metadata: the labeler's ``metadata()`` (the Parquet ``pcd.*`` keys).
        input_tokens: tokens of the request's record texts as the model's tokenizer reads them
            (the shared prompt head and the answers not counted); failed records count 0.
        queue_ms: milliseconds from arrival to the start of its first decode call.
        decode_ms: milliseconds of the decode calls its records were in (shared with the
            requests packed with it).
        labeler: the labeler that decoded it (``output_schema`` for rendering).
    """

    results: list
    labeler_metadata: dict[str, str]
    input_tokens: int
    queue_ms: float
    decode_ms: float
    labeler: Labeler | None = None


@dataclass
class _Entry:
    """One labeler slot: a schema with its options, and the labeler once compiled (worker only)."""

    key: tuple
    schema: Schema
    options: LabelJob
    name: str | None = None
    pinned: bool = False
    labeler: Labeler | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    #: the job's warnings (``pcd_cli.job.JobWarning``), known once compiled
    warnings: list = field(default_factory=list)
    #: ``(labeler, its spare)`` for long records (``LabelService._spare``)
    spare: tuple[Labeler, Labeler] | None = None


@dataclass(eq=False)
class _Job:
    request_id: str
    entry: _Entry
    records: list
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    arrived: float
    cursor: int = 0  # next record to take
    done: int = 0  # records whose results were delivered
    results: list = field(default_factory=list)
    started: float | None = None
    decode_s: float = 0.0
    tokens: int = 0
    cancelled: bool = False
    finished: bool = False
    deadline: float | None = None  # time.monotonic() past which nothing more is done for it
    since: float | None = None  # the client request's arrival (its deadline counts from there)

    @property
    def remaining(self) -> int:
        return len(self.records) - self.cursor


class LabelService:
    """Queues labelling requests and decodes them on one worker thread that owns the model.

    Args:
        host: a ``ModelHost`` (or any object with ``load() -> model id``, ``model_id`` and
            ``labeler(schema, options)``; tests pass one that builds fake labelers).
        schemas: the startup schemas, name -> (schema, options); compiled at startup and never
            evicted.
        config: limits and packing.
        default_options: options of request-built schemas (Jev / OpenAI question sets).

    ``start()`` starts the worker, which loads the model, compiles the startup schemas and runs a
    warm-up decode, then starts the compile thread; ``ready`` is set after that
    (``startup_error`` holds what failed). ``drain()`` refuses new work; ``wait_idle()`` waits
    for the queued work; ``close()`` stops both threads (failing what is still queued with 503)
    and joins them (``threads_alive`` names any still running: a compile cannot be interrupted).

    ``submit`` checks what reaches the tokenizer before anything is queued: a record whose text
    or id is not Unicode (a lone surrogate) fails alone; a request-built schema holding such text,
    labels that look alike (``textcheck.label_problem``) or a compile cost over
    ``config.max_compile_cost`` is refused (422, 413). A decode call of several requests that
    raises is decoded again request by request, so only the request at fault fails.

    Labelers are keyed by ``(schema.source_sha256, options)``: a submitted schema whose sha256 is
    a startup schema's uses that labeler (and its options); any other gets ``default_options``
    and a place in a bounded LRU cache (``max_cached_schemas``), so that requests with the same
    questions share one decoder and are packed together.
    """

    def __init__(self, host, schemas: dict[str, tuple[Schema, LabelJob]] | None = None, *,
                 config: ServiceConfig = ServiceConfig(), default_options: LabelJob = LabelJob()):
        self.host = host
        self.config = config
        self.default_options = default_options
        self.named: dict[str, _Entry] = {}
        self._pinned: dict[str, _Entry] = {}
        for name, (schema, options) in (schemas or {}).items():
            entry = _Entry((schema.source_sha256, options), schema, options, name=name, pinned=True)
            self.named[name] = entry
            self._pinned.setdefault(schema.source_sha256, entry)
        self._cache: OrderedDict[tuple, _Entry] = OrderedDict()
        self._cond = threading.Condition()
        self._queue: deque[_Job] = deque()
        self._queued_records = 0
        self._busy = False
        self._stopping = False
        self.draining = False
        self.ready = threading.Event()
        self.startup_error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._rate: deque[tuple[int, float]] = deque(maxlen=64)  # (records, seconds) of recent batches
        #: counters read by the metrics collector (written by the worker only)
        self.forward_passes = 0
        self.records_decoded = 0
        self.batches = 0
        #: refusals by reason (queue_full, draining, not_ready, deadline_exceeded)
        self.refused: Counter[str] = Counter()
        #: called with each answered request's queue wait in seconds (the app's histogram)
        self.on_queue_wait: Callable[[float], None] | None = None
        #: entries waiting for the compile thread, oldest first (their keys in ``_compile_pending``)
        self._compile_wanted: deque[_Entry] = deque()
        self._compile_pending: set[tuple] = set()
        self._compiler: threading.Thread | None = None
        #: set while the worker decodes other requests' chunks between a long record's passes
        self._nested = False
        #: callables run on the worker after the startup schemas are warm and before ``ready`` is
        #: set (``add_startup_step``): what must be in place before the first request is answered
        self._startup_steps: list[Callable[[], None]] = []
        self._steps_done = False

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def model_id(self) -> str:
        """The loaded model's id (``backend.model_id``)."""
        return self.host.model_id

    def add_startup_step(self, step: Callable[[], None]) -> bool:
        """Run ``step`` on the worker once the model is loaded and the startup schemas are warm,
        before ``ready`` is set (``GET /ready`` stays 503 and requests get 503 ``not_ready`` until
        it returns; an exception it raises is logged and the server starts anyway). Returns
        ``False`` (and runs nothing) when the service is ready already. Used by ``pcd serve
        --label-studio`` to serve the restored versions before the first request."""
        with self._cond:
            if self._steps_done:
                return False
            self._startup_steps.append(step)
            return True

    def start(self) -> None:
        """Start the worker thread (it loads the model, compiles the startup schemas, warms up)."""
        self._thread = threading.Thread(target=self._run, name="pcd-label-worker", daemon=True)
        self._thread.start()

    def drain(self) -> None:
        """Refuse new work (503) from now on; queued and running requests go on."""
        with self._cond:
            self.draining = True

    @property
    def idle(self) -> bool:
        """Nothing queued and no decode call running."""
        with self._cond:
            return not self._queue and not self._busy

    async def wait_idle(self, timeout: float) -> bool:
        """Wait (without blocking the event loop) until ``idle``, at most ``timeout`` seconds;
        returns whether it got idle."""
        end = time.monotonic() + timeout
        while not self.idle:
            if time.monotonic() >= end:
                return False
            await asyncio.sleep(0.02)
        return True

    def shed(self) -> int:
        """Stop taking work and fail every request still queued with 503 (``shutting_down``) at
        once, so its client hears while the HTTP server can still answer; the decode call
        running now goes on. Returns how many requests were failed. Called when a drain runs
        past ``--shutdown-timeout-s`` and by ``close``."""
        with self._cond:
            self._stopping = True
            self.draining = True
            left = list(self._queue)
            self._queue.clear()
            self._queued_records = 0
            self._cond.notify_all()
        for job in left:
            self._fail(job, ShuttingDown("the server shut down before this request was decoded; send it again"))
        return len(left)

    def close(self, timeout: float = 30.0) -> None:
        """Stop the worker: requests still queued fail with 503 (``shed``); the running decode
        call ends first; the thread is joined (at most ``timeout`` seconds)."""
        self.shed()
        end = time.monotonic() + timeout
        if self._thread is not None:
            self._thread.join(timeout)
        if self._compiler is not None:  # a compile running now ends first (it cannot be interrupted)
            self._compiler.join(max(0.0, end - time.monotonic()))

    @property
    def threads_alive(self) -> list[str]:
        """Names of the service's threads still running (after ``close``: a compile that cannot be
        interrupted, or a decode call that outlived the join)."""
        return [t.name for t in (self._thread, self._compiler) if t is not None and t.is_alive()]

    @property
    def queue_depth(self) -> tuple[int, int]:
        """(requests, records) waiting to be decoded."""
        with self._cond:
            return len(self._queue), self._queued_records

    def replace_labeler(self, name: str, labeler, options: LabelJob) -> None:
        """Serve the startup schema ``name`` with ``labeler`` (already built, e.g. over a retrained
        model; ``options`` its job) from the next request on. The swap is one assignment under the
        queue lock, so it falls between decode calls; requests already submitted keep the entry
        they were queued with and finish on the old labeler (a request is never split over two
        models). ``pcd serve --label-studio``'s retrain calls it.

        Raises:
            KeyError: ``name`` is not a startup schema.
        """
        old = self.named[name]
        entry = _Entry((old.schema.source_sha256, options, id(labeler)), old.schema, options, name=name, pinned=True,
                       labeler=labeler, metadata=labeler.metadata(),
                       warnings=schema_warnings(old.schema)
                       + list(getattr(labeler, "warnings", ())))
        with self._cond:
            self.named[name] = entry
            if self._pinned.get(old.schema.source_sha256) is old:
                self._pinned[old.schema.source_sha256] = entry
        log.info("schema %s: labeler replaced (new requests use it; queued ones finish on the old one)", name)

    def schema_info(self) -> list[dict]:
        """The startup schemas for ``GET /v1/schemas``: name, fields with their labels, schema and
        prompt-head sha256 and the job's warnings (``{"code", "message"}``;
        the prompt head and warnings are known once compiled)."""
        out = []
        for name, entry in self.named.items():
            out.append({
                "name": name,
                "fields": [{"name": f.name, "type": f.type, "labels": list(f.labels)}
                           for f in entry.schema.declared],
                "schema_sha256": entry.schema.source_sha256,
                "prompt_head_sha256": entry.metadata.get("pcd.prompt_head_sha256"),
                "warnings": [w.to_dict() for w in entry.warnings],
            })
        return out

    # -- submitting -------------------------------------------------------------------------
    async def submit(self, schema: Schema, records: Sequence[Record | RecordFailure], *, request_id: str,
                     deadline: float | None = None,
                     is_disconnected: Callable[[], Awaitable[bool]] | None = None,
                     arrived: float | None = None) -> SubmitResult:
        """Queue ``records`` for ``schema`` and wait for their results.

        Args:
            deadline: ``time.monotonic()`` seconds after which the request gets 503 (and
                nothing more is decoded for it); ``None``: ``config.request_timeout_s`` from now.
            is_disconnected: polled while waiting; true drops the request (``ClientDisconnected``).
            arrived: ``time.monotonic()`` at the client request's arrival, from which ``deadline``
                counts (the time a 503 says the request had); ``None``: now.

        Raises:
            Refused: ``NotReady``, ``Draining``, ``DeadlineExceeded``, ``ShuttingDown``, ``QueueFull``
                (with ``retry_after``), counted in ``refused`` by code.
            BadRequest: ``InvalidText``, ``InvalidOption``, ``TooCostly`` (``_check_schema``);
                ``NotCompilable``: the schema cannot be compiled for this model.
            Failure: ``CompileFailed``, ``DecodeFailed``: building its labeler or the decode call
                holding its records crashed (the server goes on).
            ClientDisconnected: ``is_disconnected`` turned true.
        """
        try:
            return await self._submit(schema, records, request_id, deadline, is_disconnected, arrived)
        except Refused as exc:
            self.refused[exc.code] += 1
            raise

    async def _submit(self, schema, records, request_id, deadline, is_disconnected, arrived=None) -> SubmitResult:
        if self.draining:
            raise Draining("the server is shutting down; send the request to another replica or again in a moment")
        if not self.ready.is_set():
            raise NotReady("the model is still loading; retry when GET /ready answers 200")
        if deadline is None and self.config.request_timeout_s is not None:
            deadline = time.monotonic() + self.config.request_timeout_s
        if schema.source_sha256 not in self._pinned:
            self._check_schema(schema)
        loop = asyncio.get_running_loop()
        job = _Job(request_id, self._entry(schema), [self._checked_record(r) for r in records], loop,
                   loop.create_future(), time.monotonic(), results=[None] * len(records), deadline=deadline,
                   since=arrived)
        with self._cond:
            if self.draining:
                raise Draining("the server is shutting down")
            self._check_room(len(records), job.entry)
            if job.records:
                self._queue.append(job)
                self._queued_records += len(job.records)
                self._want_compiled(job.entry)
                self._cond.notify_all()
        if not job.records:
            return SubmitResult([], dict(job.entry.metadata), 0, 0.0, 0.0, job.entry.labeler)
        log.info("request %s: %d records queued", request_id, len(records))
        return await self._wait(job, deadline, is_disconnected)

    def _check_schema(self, schema: Schema) -> None:
        """Refuse a request-built schema before anything is compiled: text that is not Unicode
        (a lone surrogate in a question, option or instruction), labels that look alike
        (``textcheck.label_problem``), or a compile cost over ``config.max_compile_cost``.

        Raises:
            InvalidText, InvalidOption: naming the field; TooCostly: over ``config.max_compile_cost``.
        """
        for where, text in textcheck.strings(schema, "schema"):
            at = textcheck.lone_surrogate(text)
            if at is not None:
                raise InvalidText(textcheck.surrogate_message(where, text, at))
        for f in schema.fields:
            problem = textcheck.label_problem(f.labels)
            if problem is not None:
                raise InvalidOption(f"field {f.name!r}: {problem}")
        cost = textcheck.compile_cost(schema)
        if cost > self.config.max_compile_cost:
            raise TooCostly(f"the questions' options hold about {cost} label tokens in all (options × tokens); this "
                            f"server compiles at most {self.config.max_compile_cost} per question set "
                            "(--max-compile-cost): ask fewer options or shorter ones")

    @staticmethod
    def _checked_record(record):
        """``record``, or a ``RecordFailure`` when its text or id is not Unicode text (a lone
        surrogate): it then fails alone, as ``pcd label`` fails a row with bytes that are not
        UTF-8, and never reaches a shared decode call."""
        if not isinstance(record, Record):
            return record
        for what, text in (("text", record.text), ("id", record.id)):
            if isinstance(text, str):
                at = textcheck.lone_surrogate(text)
                if at is not None:
                    rid = record.id if what == "text" else None
                    return RecordFailure(rid, textcheck.surrogate_message(f"record {rid!r}: the {what}", text, at),
                                         getattr(record, "row", None))
        return record

    def _want_compiled(self, entry: _Entry) -> None:
        """Hand ``entry`` to the compile thread unless it is compiled or already wanted (lock held)."""
        if entry.labeler is None and entry.key not in self._compile_pending:
            self._compile_pending.add(entry.key)
            self._compile_wanted.append(entry)

    @staticmethod
    def _expired(job: _Job, now: float) -> bool:
        return job.cancelled or (job.deadline is not None and now >= job.deadline)

    def _past_deadline(self, job: _Job) -> DeadlineExceeded:
        """The 503 of a job past its deadline: how many of its records were really decoded
        (results delivered, ``job.done``; never those taken into a decode call still running) and
        how many the recent rate gets through in its time."""
        seconds = job.deadline - (job.since or job.arrived) if job.deadline is not None else None
        rate = self.records_per_second
        fits = int(rate * seconds) if rate is not None and seconds is not None else None
        return DeadlineExceeded(job.done, len(job.records), seconds, fits, self._retry_after(self.queue_depth[1]))

    def _entry(self, schema: Schema) -> _Entry:
        """The labeler slot for ``schema`` (a startup one by sha256, else the LRU cache's)."""
        pinned = self._pinned.get(schema.source_sha256)
        if pinned is not None:
            return pinned
        options = self.default_options.for_question_schema(schema)
        key = (schema.source_sha256, options)
        with self._cond:
            entry = self._cache.get(key)
            if entry is None:
                entry = self._cache[key] = _Entry(key, schema, options)
                busy = {job.entry.key for job in self._queue}
                for old in list(self._cache):
                    if len(self._cache) <= self.config.max_cached_schemas:
                        break
                    if old != key and old not in busy:
                        del self._cache[old]
            self._cache.move_to_end(key)
            return entry

    def _check_room(self, n: int, entry: _Entry | None = None) -> None:
        """``QueueFull`` when ``n`` more records or one more request would overflow the queue (lock held).

        Requests waiting for a decode call (their labeler compiled) are one queue; requests whose
        question set is still compiling are another, bounded by the same numbers: compiling is
        not queueing, so a slow compile never takes the room of a served schema's request."""
        cfg = self.config
        compiling = entry is not None and entry.labeler is None
        peers = [j for j in self._queue if (j.entry.labeler is None) == compiling]
        what = "requests are waiting for their questions to compile" if compiling else "requests are queued"
        waiting_compile = sum(j.remaining for j in self._queue if j.entry.labeler is None)
        records = waiting_compile if compiling else self._queued_records - waiting_compile
        if len(peers) + 1 > cfg.max_queued_requests:
            raise QueueFull(f"{len(peers)} {what} (--max-queued-requests {cfg.max_queued_requests}); retry after the "
                            "Retry-After seconds", retry_after=self._retry_after(max(1, records // max(1, len(peers)))))
        if records + n > cfg.max_queued_records:
            raise QueueFull(f"{records} records are queued and this request adds {n} (--max-queued-records "
                            f"{cfg.max_queued_records}); retry after the Retry-After seconds",
                            retry_after=self._retry_after(records + n - cfg.max_queued_records))

    def _retry_after(self, records: int) -> int:
        """Whole seconds for ``records`` to be decoded at the recent rate (1 to 120; 1 with no
        rate measured yet)."""
        done = sum(r for r, _ in self._rate)
        seconds = sum(s for _, s in self._rate)
        if done <= 0 or seconds <= 0:
            return 1
        return int(min(120, max(1, math.ceil(records / (done / seconds)))))

    @property
    def records_per_second(self) -> float | None:
        """Records decoded per second of decoding over the last 64 decode calls."""
        done, seconds = sum(r for r, _ in self._rate), sum(s for _, s in self._rate)
        return done / seconds if seconds > 0 else None

    async def _wait(self, job: _Job, deadline: float | None, is_disconnected) -> SubmitResult:
        while True:
            timeout = POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic()))
            done, _ = await asyncio.wait({job.future}, timeout=timeout)
            if done:
                return job.future.result()
            if deadline is not None and time.monotonic() >= deadline:
                self._cancel(job)
                log.info("request %s: past its deadline", job.request_id)
                raise self._past_deadline(job)
            if is_disconnected is not None and await is_disconnected():
                self._cancel(job)
                log.info("request %s: client disconnected; dropped", job.request_id)
                raise ClientDisconnected(job.request_id)

    def _cancel(self, job: _Job) -> None:
        with self._cond:
            job.cancelled = True
            if job in self._queue:
                self._queue.remove(job)
                self._queued_records -= job.remaining

    # -- the worker -------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._startup()
        except BaseException as exc:  # noqa: BLE001 - reported by the server, which exits
            self.startup_error = exc
            log.error("startup failed: %s", exc)
            return
        while not self._stopping:
            with self._cond:
                if not self._startup_steps:
                    self._steps_done = True  # add_startup_step refuses from here on
                    break
                step = self._startup_steps.pop(0)
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - the server starts on what it has
                log_crash(log, "a start-up step failed", exc)
        if self._stopping:
            return
        self._compiler = threading.Thread(target=self._compile_loop, name="pcd-compile-worker", daemon=True)
        self._compiler.start()
        self.ready.set()
        while True:
            with self._cond:
                batch: list = []
                while not self._stopping and not (batch := self._take()):
                    self._cond.wait()
                if self._stopping:
                    return
                self._busy = True
            try:
                self._decode(batch)
            finally:
                with self._cond:
                    self._busy = False

    def _startup(self) -> None:
        """Load the model, compile every startup schema, decode one warm-up record with each."""
        started = time.perf_counter()
        model_id = self.host.load()
        log.info("model %s loaded in %.1f s", model_id, time.perf_counter() - started)
        for name, entry in self.named.items():
            if self._stopping:  # SIGTERM while loading: stop between schemas
                log.info("stopped while starting")
                return
            labeler = self._labeler(entry)
            for warning in entry.warnings:  # the job's warnings, as pcd label prints them
                log.warning("schema %s: %s (%s)", name, warning.message, warning.code)
            labeler.label_batch([Record("warm-up", "Warm-up record: hello.")])
            log.info("schema %s compiled and warmed up", name)
        if not self.named:  # no startup schema: warm the model with a one-field question
            from ..schema.load import parse_schema

            warm = parse_schema({"name": "warm-up", "fields": {"ok": {"type": "boolean", "description": "ok"}}})
            self._labeler(_Entry(("warm-up",), warm, self.default_options)).label_batch(
                [Record("warm-up", "Warm-up record: hello.")])

    def _labeler(self, entry: _Entry):
        """The entry's labeler, compiled on first use (worker thread)."""
        if entry.labeler is None:
            labeler = self.host.labeler(entry.schema, entry.options)
            entry.metadata = labeler.metadata()
            entry.warnings = schema_warnings(entry.schema) + list(getattr(labeler, "warnings", ()))
            entry.labeler = labeler
        return entry.labeler

    def _is_long(self, record) -> bool:
        """Whether ``record`` is decoded alone (``config.long_record_tokens``; module doc)."""
        return estimate_tokens(record) > self.config.long_record_tokens

    def _take(self, short_only: bool = False) -> list[tuple[_Job, int, int]]:
        """The next batch (lock held): chunks of queued jobs as ``(job, start, end)``, from the
        oldest job whose labeler is compiled and the later jobs for the same labeler; jobs with
        records left go to the back of the queue. A chunk stops before a long record; a long
        record is a batch alone (``short_only``: never taken, for the batches decoded between
        a long record's passes). A job past its deadline (or cancelled) is dropped here, between
        chunks, and answered 503. Empty when no queued job is ready (those wait for the compile
        thread, which never holds up the decode worker)."""
        cfg = self.config
        now = time.monotonic()
        for job in [j for j in self._queue if self._expired(j, now)]:
            self._queue.remove(job)
            self._queued_records -= job.remaining
            if not job.cancelled:
                log.info("request %s: past its deadline; dropped before decoding", job.request_id)
                self._fail(job, self._past_deadline(job))
        first = next((j for j in self._queue if j.entry.labeler is not None
                      and not (short_only and self._is_long(j.records[j.cursor]))), None)
        if first is None:
            return []
        if self._is_long(first.records[first.cursor]):  # a long record: a decode call of its own
            candidates = [first]
        else:
            candidates = [first] + ([j for j in self._queue if j is not first and j.entry is first.entry]
                                    if cfg.packing else [])
        batch: list[tuple[_Job, int, int]] = []
        records = tokens = 0
        for job in candidates:
            start = end = job.cursor
            cost = 0
            if self._is_long(job.records[start]):
                if batch:
                    continue  # never packed: taken alone when it is the oldest's next record
                end, cost = start + 1, estimate_tokens(job.records[start])
            else:  # a chunk stops before a long record
                while end < min(start + cfg.chunk_records, len(job.records)) and not self._is_long(job.records[end]):
                    cost += estimate_tokens(job.records[end])
                    end += 1
            if batch and (records + end - start > cfg.max_batch_records or tokens + cost > cfg.max_batch_tokens):
                break
            batch.append((job, start, end))
            records, tokens = records + end - start, tokens + cost
            job.cursor = end
            if job.started is None:
                job.started = now
        for job, start, end in batch:
            self._queue.remove(job)
            self._queued_records -= end - start
            if job.remaining:
                self._queue.append(job)
        return batch

    def _compile_loop(self) -> None:
        """The compile thread: compiles the labelers of request-built schemas, oldest wanted
        first, off the decode path (decoding of compiled schemas goes on meanwhile). An entry no
        live request waits for any more (all cancelled or past their deadline) is not compiled.
        A schema that does not compile fails its queued requests (422 for a ``PcdError``, else
        500); the thread goes on."""
        while True:
            with self._cond:
                while not self._compile_wanted and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                entry = self._compile_wanted.popleft()
                now = time.monotonic()
                waiting = [j for j in self._queue if j.entry is entry and not self._expired(j, now)]
                if entry.labeler is not None or not waiting:
                    self._compile_pending.discard(entry.key)
                    if not waiting and entry.labeler is None:
                        log.info("schema %s: no request waits for it any more; not compiled", entry.schema.name)
                    continue
            ids = ",".join(j.request_id for j in waiting)
            started = time.perf_counter()
            error: ServiceError | None = None
            try:
                self._labeler(entry)
            except PcdError as exc:
                log.warning("requests %s: schema %s does not compile: %s", ids, entry.schema.name, exc)
                error = NotCompilable(str(exc))
            except Exception as exc:  # noqa: BLE001 - one request's failure never stops the thread
                log_crash(log, f"requests {ids}: compiling schema {entry.schema.name} failed", exc)
                error = CompileFailed(f"compiling this request's questions failed ({type(exc).__name__}); the server "
                                      "goes on; the server log has the details under this request id")
            failed: list[_Job] = []
            with self._cond:
                self._compile_pending.discard(entry.key)
                if error is not None:
                    failed = [j for j in self._queue if j.entry is entry]
                    for job in failed:
                        self._queue.remove(job)
                        self._queued_records -= job.remaining
                self._cond.notify_all()
            for job in failed:
                self._fail(job, error)
            if error is None:
                log.info("schema %s compiled in %.1f s (off the decode path)", entry.schema.name,
                         time.perf_counter() - started)

    def _decode(self, batch: list[tuple[_Job, int, int]]) -> None:
        """One decode call for ``batch``; results split back, finished jobs answered. When a call
        holding several requests raises, each request is decoded again alone, so only the one at
        fault fails (500 ``decode_failed``); a job cancelled or past its deadline is dropped first.
        A batch of one long record is decoded on the entry's spare labeler, and between its
        passes the worker decodes other requests' short chunks (``_interleave``); a call none of
        whose jobs is live any more is abandoned before its next pass."""
        now = time.monotonic()
        live = []
        for job, s, e in batch:
            if job.cancelled:
                continue
            if job.deadline is not None and now >= job.deadline:
                log.info("request %s: past its deadline; dropped before decoding", job.request_id)
                self._drop_and_fail(job, self._past_deadline(job))
                continue
            live.append((job, s, e))
        if not live:
            return
        entry = live[0][0].entry
        long = len(live) == 1 and live[0][2] - live[0][1] == 1 and self._is_long(live[0][0].records[live[0][1]])
        try:
            labeler = self._labeler(entry)  # compiled by the compile thread before _take took it
            decoder = self._spare(entry) if long and not self._nested else labeler
        except Exception as exc:  # noqa: BLE001 - cannot happen unless the entry was reset
            log_crash(log, "compiling schema failed", exc)
            for job, _, _ in live:
                self._drop_and_fail(job, _internal(exc))
            return
        try:
            self._deliver(entry, labeler, live, *self._label(decoder, live, interleave=decoder is not labeler))
            return
        except _Abandoned:
            self._abandoned(live)
            return
        except Exception as exc:  # noqa: BLE001
            if len(live) == 1:
                log_crash(log, f"request {live[0][0].request_id}: decode call failed", exc)
                self._drop_and_fail(live[0][0], _internal(exc))
                return
            log.warning("requests %s: a decode call of %d requests failed (%s); decoding each alone so that only "
                        "the one at fault fails", ",".join(j.request_id for j, _, _ in live), len(live),
                        type(exc).__name__)
        for part in live:
            try:
                self._deliver(entry, labeler, [part], *self._label(labeler, [part]))
            except _Abandoned:
                self._abandoned([part])
            except Exception as exc:  # noqa: BLE001
                log_crash(log, f"request {part[0].request_id}: decode call failed (decoded alone)", exc)
                self._drop_and_fail(part[0], _internal(exc))

    def _spare(self, entry: _Entry):
        """The entry's spare labeler (built once): the same compiled schema, model and options,
        with a head cache of its own (``Decoder.spare``), so that a long record decoded on it
        can stop between passes while other chunks are decoded on the entry's labeler."""
        if entry.spare is None or entry.spare[0] is not entry.labeler:
            entry.spare = (entry.labeler, spare_labeler(entry.labeler))
        return entry.spare[1]

    def _interleave(self) -> None:
        """Between two passes of a long record: decode one batch of the other queued requests'
        short chunks (on their entries' own labelers), if any is ready."""
        if self._nested:
            return
        with self._cond:
            batch = [] if self._stopping else self._take(short_only=True)
        if not batch:
            return
        self._nested = True
        try:
            self._decode(batch)
        except Exception as exc:  # noqa: BLE001 - never fails the long record's call it runs inside
            log_crash(log, "decoding between a long record's passes failed", exc)
            for job, _, _ in batch:
                if not job.finished:
                    self._drop_and_fail(job, _internal(exc))
        finally:
            self._nested = False

    def _abandoned(self, batch: list[tuple[_Job, int, int]]) -> None:
        """A decode call given up between passes (no live job left in it): its jobs were
        answered already (past their deadline or gone); nothing of it is counted."""
        log.info("requests %s: decode call abandoned between passes (no request in it waits any more)",
                 ",".join(job.request_id for job, _, _ in batch))
        for job, _, _ in batch:
            if not job.cancelled and not job.finished:
                self._drop_and_fail(job, self._past_deadline(job))

    def _label(self, labeler, batch: list[tuple[_Job, int, int]], *,
               interleave: bool = False) -> tuple[list, list[int], float]:
        """One ``label_batch`` call over ``batch``'s chunks: ``(results, tokens per chunk, seconds)``;
        the counters (forward passes, records, calls, rate) are updated.

        Before each forward pass the decoder calls ``between_passes`` (``Decoder.between_passes``):
        it raises ``_Abandoned`` once no job of the batch is live (past its deadline, cancelled),
        and with ``interleave`` decodes other requests' short chunks (``_interleave``)."""
        items = [r for job, s, e in batch for r in job.records[s:e]]
        passes = labeler.forward_passes
        started = time.perf_counter()
        target = getattr(labeler, "decoder", labeler)

        def between_passes() -> None:
            now = time.monotonic()
            if all(self._expired(job, now) for job, _, _ in batch):
                raise _Abandoned()
            if interleave:
                self._interleave()

        target.between_passes = between_passes
        try:
            out = labeler.label_batch(items)
            if len(out) != len(items):
                raise RuntimeError(f"label_batch returned {len(out)} results for {len(items)} records")
            if all(self._expired(job, time.monotonic()) for job, _, _ in batch):
                raise _Abandoned()  # finished after every request in it was answered: not counted
            counts = [_count_tokens(labeler, job.records[s:e]) for job, s, e in batch]
        finally:
            target.between_passes = None
            self.forward_passes += labeler.forward_passes - passes
        seconds = time.perf_counter() - started
        self._rate.append((len(items), seconds))
        self.records_decoded += len(items)
        self.batches += 1
        log.info("decode call: %d records of %d requests (%s) in %.1f ms, %d forward passes", len(items),
                 len(batch), ",".join(job.request_id for job, _, _ in batch), seconds * 1e3,
                 labeler.forward_passes - passes)
        return out, counts, seconds

    def _deliver(self, entry: _Entry, labeler, batch: list[tuple[_Job, int, int]], out: list, counts: list[int],
                 seconds: float) -> None:
        """Split one call's results back to its jobs; answer the jobs now complete."""
        pos = 0
        for (job, s, e), tokens in zip(batch, counts):
            job.results[s:e] = out[pos:pos + e - s]
            pos += e - s
            job.done += e - s
            job.decode_s += seconds
            job.tokens += tokens
            if job.done == len(job.records) and not job.cancelled:
                self._finish(job, SubmitResult(job.results, dict(entry.metadata), job.tokens,
                                               (job.started - job.arrived) * 1e3, job.decode_s * 1e3, labeler))

    def _drop_and_fail(self, job: _Job, error: Exception) -> None:
        with self._cond:
            if job in self._queue:
                self._queue.remove(job)
                self._queued_records -= job.remaining
        self._fail(job, error)

    def _finish(self, job: _Job, result: SubmitResult) -> None:
        job.finished = True
        if self.on_queue_wait is not None:
            self.on_queue_wait(result.queue_ms / 1e3)
        _resolve(job, lambda fut: fut.set_result(result))

    def _fail(self, job: _Job, error: Exception) -> None:
        job.finished = True
        _resolve(job, lambda fut: fut.set_exception(error))


def _resolve(job: _Job, action: Callable[[asyncio.Future], None]) -> None:
    """Run ``action`` on the job's future in its event loop (a closed loop or a future already
    settled, e.g. after a deadline, is ignored)."""

    def apply() -> None:
        if not job.future.done():
            action(job.future)

    try:
        job.loop.call_soon_threadsafe(apply)
    except RuntimeError:  # the loop is closed: nobody waits any more
        pass


def spare_labeler(labeler):
    """A copy of ``labeler`` sharing its compiled schema, model, calibration and options, with a
    decoder of its own head cache (``Decoder.spare``) when it has one; a labeler without a
    decoder (tests' fakes) is copied shallowly."""
    twin = copy.copy(labeler)
    decoder = getattr(labeler, "decoder", None)
    if decoder is not None and hasattr(decoder, "spare"):
        twin.decoder = decoder.spare()
    return twin


def _internal(exc: Exception) -> DecodeFailed:
    return DecodeFailed(f"the decode call holding this request failed ({type(exc).__name__}); the server goes on; "
                        "the server log has the details under this request id")


def _count_tokens(labeler, records: Sequence[Record | RecordFailure]) -> int:
    """Tokens of the records' texts under the labeler's tokenizer (worker thread); a labeler
    without one (tests) may give ``count_tokens(text)``."""
    count = getattr(labeler, "count_tokens", None)
    if count is None:
        tokenizer = labeler.backend.tokenizer
        encode = getattr(tokenizer, "encode_text", None) or tokenizer.encode
        count = lambda text: len(encode(text))  # noqa: E731
    return sum(count(r.text) for r in records if isinstance(r, Record))

