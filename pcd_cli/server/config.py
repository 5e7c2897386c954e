"""``AppConfig``: the HTTP-side settings of ``pcd serve`` (its defaults: ``limits.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import limits

if TYPE_CHECKING:
    from .label_studio import LabelStudioConfig


@dataclass(frozen=True)
class AppConfig:
    """HTTP-side settings of ``pcd serve``.

    Attributes:
        api_keys: keys accepted (``Authorization: Bearer KEY``, ``x-api-key: KEY``, or KEY as the
            password of ``Authorization: Basic``, as Label Studio sends it); empty: no
            key needed.
        max_body_bytes: largest request body (after decompression); larger is 413, refused
            while streaming (never read whole).
        max_records_per_request: most records in one ``/v1/label`` request (most questions in
            a Jev or OpenAI one); more is 413.
        request_timeout_s: a request not answered this long after it arrived gets 503.
        cors_origins: origins allowed by CORS; empty: no CORS headers at all.
        read_timeout_s: most seconds to receive a request's header block (from its first byte,
            or from the connection's opening) and, separately, its body (from the end of the
            headers); past it 408 and the connection is closed (Slowloris, CVE-2007-6750).
            ``None``: ``request_timeout_s`` (60 when that is ``None`` too).
        max_header_bytes: largest request line plus header block; larger is 431 (RFC 6585 §5)
            and the connection is closed (h11's ``max_incomplete_event_size``).
        max_connections: most open connections; one more is answered 503 ``too_many_connections``
            (``Retry-After: 1``) and closed.
        allowed_hosts: ``Host`` names answered besides the loopback ones when the server listens
            on loopback (and the only ones answered otherwise, when given); ``"*"``: any Host.
            Another Host is 421 (RFC 9110 §15.5.20): a web page reaching a loopback server
            through DNS rebinding sends its own name.
    """

    api_keys: tuple[str, ...] = ()
    max_body_bytes: int = limits.MAX_BODY_BYTES
    max_records_per_request: int = limits.MAX_RECORDS_PER_REQUEST
    request_timeout_s: float | None = limits.REQUEST_TIMEOUT_S
    cors_origins: tuple[str, ...] = ()
    read_timeout_s: float | None = None
    max_header_bytes: int = limits.MAX_HEADER_BYTES
    max_connections: int = limits.MAX_CONNECTIONS
    allowed_hosts: tuple[str, ...] = ()
    #: ``pcd serve --label-studio``: a ``label_studio.LabelStudioConfig`` mounts the Label Studio
    #: ML backend routes (``/setup``, ``/predict``, ``/webhook``, ``/train``, ``/versions``).
    label_studio: LabelStudioConfig | None = None

    @property
    def receive_timeout_s(self) -> float:
        """``read_timeout_s``, else ``request_timeout_s``, else 60 seconds."""
        return float(self.read_timeout_s or self.request_timeout_s or 60.0)
