"""The errors of ``pcd serve``'s service and its Label Studio backend, without HTTP: one class per
error kind, each with its ``code`` (the ``error.code`` a client reads) and, where waiting helps,
``retry_after`` (whole seconds).

None carries an HTTP status or header: ``server/errors.py``'s one table (``ANSWERS``) maps each
code to the status and error type the client is answered with, and renders ``retry_after`` as
``Retry-After``, once, at the edge (as vLLM's engine errors, ``v1/engine/exceptions.py``, carry no
status and its API server maps them). ``service.py``, ``label_studio.py`` and ``wire.py`` raise
these; a new kind is a class here (or in its domain module, as ``label_studio.MappingError``) and
a row of ``ANSWERS`` (``tests/server/test_error_kinds.py`` checks every kind has one).

The families:

* ``Refused``: the server could not take or finish the request for a reason of its own (load,
  state, time); the same request may succeed later. The service counts each by code
  (``pcd_requests_refused_total``).
* ``BadRequest``: the request itself cannot be served as sent (an ``InputError``: text that is
  not Unicode, options alike, a question set too costly or not compilable, a record the decoder
  fails, an unknown project, a label config that maps to no schema).
* ``Failure``: a crash on the server's side while serving the request (its details are in the
  log under the request id, never in the answer); the server goes on.
* ``StartupFailed``, ``JournalUnwritable``: the server could not start; an event it could not
  keep on disk.
"""

from __future__ import annotations

from typing import ClassVar

from ..errors import InputError, PcdError


class ServiceError(PcdError):
    """An error of the service about one request.

    Attributes:
        code: the kind's short machine-readable code (a class attribute; ``error.code`` on the wire).
        message: a sentence naming what is wrong and how to fix it.
        retry_after: whole seconds after which the same request may succeed (``None``: no advice);
            the class's default unless given.
    """

    code: ClassVar[str] = "service_error"
    #: the kind's default ``retry_after`` (seconds; ``None``: none)
    default_retry_after: ClassVar[int | None] = None

    def __init__(self, message: str, *, retry_after: int | None = None):
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after if retry_after is not None else self.default_retry_after


class Refused(ServiceError):
    """The server could not take or finish the request for a reason of its own (load, state,
    time); the same request may succeed later (``retry_after``)."""


class QueueFull(Refused):
    """More requests or records are queued than ``--max-queued-requests`` /
    ``--max-queued-records`` allow; ``retry_after`` is the time the queue's excess takes at the
    recent decode rate (``LabelService._retry_after``)."""

    code = "queue_full"


class Draining(Refused):
    """The server is shutting down (SIGTERM) and takes no new work."""

    code = "draining"
    default_retry_after = 1


class NotReady(Refused):
    """The model and startup schemas are still loading (or the Label Studio backend's served
    versions being restored)."""

    code = "not_ready"
    default_retry_after = 1


class StartupFailed(ServiceError):
    """The server could not start (``LabelService.startup_error``); no retry helps."""

    code = "startup_failed"


class ShuttingDown(Refused):
    """The server shut down before the queued request was decoded (``LabelService.shed``)."""

    code = "shutting_down"
    default_retry_after = 1


class DeadlineExceeded(Refused):
    """A request not answered within its deadline (``--request-timeout-s``, counted from its
    arrival).

    Attributes:
        done: records whose results were delivered (decoded) before the deadline; total: the
            request's records; seconds: the time the request had (``None``: unknown); fits: records
            the recent decode rate gets through in that time (``None``: no rate measured yet);
            unit: what the message counts (``records``, Label Studio's ``tasks``).
    """

    code = "deadline_exceeded"

    def __init__(self, done: int, total: int, seconds: float | None, fits: int | None, retry_after: int,
                 unit: str = "records"):
        self.done, self.total, self.seconds, self.fits, self.unit = done, total, seconds, fits, unit
        within = f"{seconds:.2g} s" if seconds is not None else "its deadline"
        size = f"; at the recent rate about {fits} {unit} fit in {within}" if fits is not None else ""
        super().__init__(f"the request was not answered within {within} ({done} of {total} {unit} decoded{size}; "
                         "--request-timeout-s): send fewer, or retry later", retry_after=retry_after)

    def counted(self, before: int, total: int, unit: str) -> "DeadlineExceeded":
        """The same refusal for a client request submitted in slices: ``before`` of its ``total``
        records were decoded by earlier slices (Label Studio's ``/predict``)."""
        return DeadlineExceeded(before + self.done, total, self.seconds, self.fits, self.retry_after or 1, unit)


class BadRequest(ServiceError, InputError):
    """The request cannot be served as sent (the message names the field, question or record)."""


class InvalidText(BadRequest):
    """Text of a request-built schema that is not Unicode (a lone surrogate), naming where."""

    code = "invalid_text"


class InvalidOption(BadRequest):
    """Options of a request-built field a reader cannot tell apart (``textcheck.label_problem``)."""

    code = "invalid_option"


class TooCostly(BadRequest):
    """A request-built question set whose compile cost is over ``--max-compile-cost``, refused
    before anything is compiled."""

    code = "too_costly"


class NotCompilable(BadRequest):
    """A request-built schema the model cannot express (a ``PcdError`` from building its labeler)."""

    code = "schema_not_compilable"


class RecordFailed(BadRequest):
    """A decision request's one record (its state) that the decoder failed (a text too long for
    the model with ``--truncate error``, ...), with the decoder's message."""

    code = "record_failed"


class UnknownProject(BadRequest):
    """A Label Studio request for a project that never called ``/setup`` and carries no label config."""

    code = "unknown_project"


class Failure(ServiceError):
    """A crash on the server's side while serving the request; the answer never quotes it (the
    log has it under the request id) and the server goes on."""


class CompileFailed(Failure):
    """Building the labeler of a request's questions crashed (not a ``PcdError``)."""

    code = "compile_failed"


class DecodeFailed(Failure):
    """The decode call holding the request's records crashed (each request of a shared call is
    decoded again alone first, so only the one at fault gets it)."""

    code = "decode_failed"


class JournalUnwritable(ServiceError):
    """An event the Label Studio backend could not keep on disk (its gold journal or project
    link); the message names the file and the system's reason."""

    code = "journal_unwritable"
    default_retry_after = 60
