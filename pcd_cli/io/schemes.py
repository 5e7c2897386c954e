"""What pcd knows of each storage scheme, in one table: ``SCHEMES``, a frozen row per scheme.

``pyarrow.fs.FileSystem.from_uri`` opens every scheme below; a row holds only what pcd adds to
pyarrow: where the store's client reads its endpoint from (for messages), a setting pcd gives
every URI of it unless the URI says (GCS's retry limit), the probe that tells "no credentials"
from "wrong credentials", and the fix each failure's message ends with. Opening
(``pcd_cli.io.storage.open_location``), the URI helpers (``uri_scheme``, ``split_query``,
``is_remote``, ``local_path``) and ``store_error`` read the row (``scheme_row``); nothing else in
pcd names a scheme. Adding one is a row here and its test (docs/architecture.md, "Where a new
... goes"). As fsspec's ``registry.known_implementations``: one row per scheme, its fix text in
the row.

The credentials and settings are each cloud's standard ones, read by pyarrow itself: for S3 the
``AWS_*`` variables (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``,
``AWS_PROFILE`` and the shared config files, ``AWS_REGION``, ``AWS_ENDPOINT_URL`` or
``AWS_ENDPOINT_URL_S3`` for an S3-compatible store: pyarrow 25 honours both, checked against
SeaweedFS); for GCS Google's application default credentials (``GOOGLE_APPLICATION_CREDENTIALS``,
gcloud's file, the metadata server) or ``gs://anonymous@...``, and google-cloud-cpp's
``CLOUD_STORAGE_EMULATOR_ENDPOINT`` for an emulator (checked against fake-gcs-server).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Callable

#: Seconds the GCS client retries a failing request when the URI does not say
#: (``?retry_limit_seconds=N``). The client's own default is 15 minutes: an unreachable endpoint
#: or missing credentials would hang a run that long before its one-line error.
GCS_RETRY_SECONDS = 60


@dataclass(frozen=True)
class Scheme:
    """One storage scheme as pcd knows it (every field but ``names`` has the default of a scheme
    pcd knows nothing more about than pyarrow does).

    Attributes:
        names: the scheme and its aliases, lower case (``("gs", "gcs")``).
        on_disk: the local disk: pcd keeps a ``pathlib`` path (atomic renames, symlinks), its
            URI takes no query of settings (``file://``).
        path_uri: a path follows ``//`` (``file:///tmp/x``): a one-slash typo (``file:/tmp/x``)
            keeps its slash in the URI meant, where ``s3:/b/x`` means ``s3://b/x``.
        endpoint_variables: the variables the store's client reads its endpoint from, the first
            set one winning; messages name the endpoint (`` at <endpoint>``).
        retry_setting: the URI setting that bounds how long the client retries a failing
            request, given ``retry_seconds()`` unless the URI sets it; ``None``: the client's
            own limit is short enough.
        missing_credentials: the credential probe: ``None`` when some source of credentials is
            set up, else what is missing (``"no AWS credentials were found"``), said after
            "access denied and"; ``None`` (no probe): a denial is said as "with the credentials
            given".
        no_credentials_fix: the fix when the probe finds none.
        denied_fix: the fix for a denial with credentials.
        no_bucket_fix: the fix for a missing bucket.
        unreachable_fix: the fix for an endpoint that cannot be reached.
        no_token: the client's words when no credentials gave it an access token (GCS), or
            ``None``; then ``no_token_reason(message)`` says why and ``no_token_fix`` the fix.
    """

    names: tuple[str, ...]
    on_disk: bool = False
    path_uri: bool = False
    endpoint_variables: tuple[str, ...] = ()
    retry_setting: str | None = None
    missing_credentials: Callable[[], str | None] | None = None
    no_credentials_fix: str = ""
    denied_fix: str = "check the credentials and the bucket's permissions"
    no_bucket_fix: str = "check the bucket name"
    unreachable_fix: str = "check the endpoint and the network"
    no_token: str | None = None
    no_token_reason: Callable[[str], str] | None = None
    no_token_fix: str = ""

    def endpoint(self) -> str | None:
        """The endpoint the store's client will use, from ``endpoint_variables``; ``None`` when
        none is set (the store's default)."""
        return next((os.environ[v] for v in self.endpoint_variables if os.environ.get(v)), None)

    def retry_seconds(self) -> int:
        """Seconds ``retry_setting`` is given (``GCS_RETRY_SECONDS``, read when called)."""
        return GCS_RETRY_SECONDS


def _aws_credentials() -> str | None:
    """``None`` when any of the AWS SDK's usual credential sources is set up (variables, profile,
    the shared files, a web identity, a container's credentials; the instance metadata is not
    asked), else what is missing."""
    if os.environ.get("AWS_ACCESS_KEY_ID") or os.environ.get("AWS_PROFILE") \
            or os.environ.get("AWS_WEB_IDENTITY_TOKEN_FILE") or os.environ.get("AWS_CONTAINER_CREDENTIALS_FULL_URI") \
            or os.environ.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
        return None
    home = os.path.expanduser("~")
    files = (os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(home, ".aws", "credentials"),
             os.environ.get("AWS_CONFIG_FILE") or os.path.join(home, ".aws", "config"))
    return None if any(os.path.isfile(f) for f in files) else "no AWS credentials were found"


def _google_credentials() -> str | None:
    """``None`` when ``GOOGLE_APPLICATION_CREDENTIALS`` is set, else that it is not."""
    return None if os.environ.get("GOOGLE_APPLICATION_CREDENTIALS") else "GOOGLE_APPLICATION_CREDENTIALS is not set"


def _google_no_token(message: str) -> str:
    """Why GCS got no access token: the key file of ``GOOGLE_APPLICATION_CREDENTIALS`` failed (the
    client's reason quoted from ``message``, 200 characters at most), or no credentials at all."""
    cause = re.search(r"The underlying error message was: (.*?)(?: error_info=|\)?$)", message)
    key = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if key:
        return f"the credentials of GOOGLE_APPLICATION_CREDENTIALS={key} gave no access token" + (
            f" ({cause.group(1)[:200]})" if cause else "")
    return ("no Google credentials were found (no GOOGLE_APPLICATION_CREDENTIALS, no gcloud application-default "
            "file, no metadata server answered)")


S3 = Scheme(
    ("s3",),
    endpoint_variables=("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),  # pyarrow 25 honours both (SeaweedFS)
    missing_credentials=_aws_credentials,
    no_credentials_fix="set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE (~/.aws/credentials)",
    denied_fix="check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE and the bucket's policy",
    no_bucket_fix="check the bucket name (and AWS_ENDPOINT_URL / AWS_REGION for the store meant)",
    unreachable_fix="check AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3) and the network",
)
GCS = Scheme(
    ("gs", "gcs"),
    endpoint_variables=("CLOUD_STORAGE_EMULATOR_ENDPOINT",),  # google-cloud-cpp's (fake-gcs-server)
    retry_setting="retry_limit_seconds",
    missing_credentials=_google_credentials,
    no_credentials_fix="set GOOGLE_APPLICATION_CREDENTIALS to a service account key file, or run where the metadata "
                       "server gives one",
    no_bucket_fix="check the bucket name (and the endpoint: CLOUD_STORAGE_EMULATOR_ENDPOINT or ?endpoint_override=)",
    unreachable_fix="check CLOUD_STORAGE_EMULATOR_ENDPOINT (or the URI's ?endpoint_override=) and the network",
    no_token="Could not create a OAuth2 access token",  # none found, an unreadable key file, no metadata server
    no_token_reason=_google_no_token,
    no_token_fix="set GOOGLE_APPLICATION_CREDENTIALS to a service account key file (or run `gcloud auth "
                 "application-default login`, or run where the metadata server gives credentials); a public "
                 "bucket or an emulator needs none: gs://anonymous@bucket/...",
)

#: Every scheme ``pyarrow.fs.FileSystem.from_uri`` opens (pyarrow 25: each checked with a URI of
#: it; ``hdfs``/``viewfs`` need a JVM, ``abfs``/``abfss`` an account, but pyarrow knows them).
#: ``local://`` is pyarrow's own name for the local disk, opened through pyarrow as a store is.
SCHEMES: tuple[Scheme, ...] = (
    S3,
    GCS,
    Scheme(("file",), on_disk=True, path_uri=True),
    Scheme(("local",), path_uri=True),
    Scheme(("mock",)),
    Scheme(("hdfs", "viewfs")),
    Scheme(("abfs", "abfss")),
    Scheme(("hf",)),
)
#: Each name (an alias included) -> its row.
BY_NAME: dict[str, Scheme] = {name: row for row in SCHEMES for name in row.names}


def scheme_row(name: str | None) -> Scheme:
    """The row of the scheme ``name`` (lower case, as ``uri_scheme`` gives it); for ``None`` (a
    plain path) the ``file`` row; for a scheme not in the table a row with the defaults (pyarrow
    may know it, or refuses it when it is opened)."""
    if name is None:
        return BY_NAME["file"]
    return BY_NAME.get(name) or Scheme((name,))
