"""The storage schemes' table (``pcd_cli.io.schemes``): a row is all a scheme needs, aliases
say the same, and no code outside the table names a scheme. The real stores' messages are
tested against SeaweedFS and fake-gcs-server (``test_storage.py``, ``test_gcs_storage.py``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import pcd_cli
from pcd_cli.errors import InputError, MachineError, StoreError
from pcd_cli.io import schemes, storage

#: A scheme pcd does not ship, added by its row alone (docs/architecture.md, "a storage scheme").
TOY = schemes.Scheme(
    ("toy", "toys"),
    endpoint_variables=("TOY_ENDPOINT_URL",),
    missing_credentials=lambda: None if __import__("os").environ.get("TOY_TOKEN") else "TOY_TOKEN is not set",
    no_credentials_fix="set TOY_TOKEN",
    denied_fix="check TOY_TOKEN and the bucket's grants",
    no_bucket_fix="check the bucket name (and TOY_ENDPOINT_URL)",
    unreachable_fix="check TOY_ENDPOINT_URL and the network",
    no_token="toy: token refused",
    no_token_reason=lambda message: f"the toy token was refused ({message.rpartition('because ')[2]})",
    no_token_fix="run `toy login`",
)


@pytest.fixture
def toy(monkeypatch):
    for name in TOY.names:
        monkeypatch.setitem(schemes.BY_NAME, name, TOY)
    monkeypatch.delenv("TOY_TOKEN", raising=False)
    monkeypatch.delenv("TOY_ENDPOINT_URL", raising=False)
    return TOY


def test_a_new_scheme_is_one_row_read_by_uris_and_store_errors(toy, monkeypatch):
    """Every message and classification of a ``toy://`` URI comes from its row: the one-slash
    typo, the query of settings, the endpoint, the credential probe and each fix."""
    with pytest.raises(InputError, match=re.escape("'toys:/b/x' looks like a URI with one slash after 'toys:': "
                                                   "did you mean 'toys://b/x'?")):
        storage.uri_scheme("toys:/b/x")
    assert storage.is_remote("toy://b/x") and storage.local_path("toy://b/x") is None
    assert storage.split_query("toy://b/x.parquet?region=eu") == ("toy://b/x.parquet", "?region=eu")

    def said(exc: OSError, uri: str = "toy://b/x") -> str:
        return str(storage.store_error(exc, uri))

    assert said(OSError("AccessDenied")) == ("'toy://b/x': cannot read: access denied and TOY_TOKEN is not set; "
                                             "set TOY_TOKEN")
    monkeypatch.setenv("TOY_TOKEN", "t")
    assert said(OSError("403 Forbidden")) == ("'toy://b/x': cannot read: access denied with the credentials given; "
                                              "check TOY_TOKEN and the bucket's grants")
    assert said(OSError("NoSuchBucket")) == ("'toy://b/x': cannot read: no such bucket 'b'; "
                                             "check the bucket name (and TOY_ENDPOINT_URL)")
    monkeypatch.setenv("TOY_ENDPOINT_URL", "http://toy.local:9")
    assert said(OSError("Connection refused")) == ("'toy://b/x': cannot read: the store at http://toy.local:9 cannot "
                                                   "be reached (Connection refused); check TOY_ENDPOINT_URL and the "
                                                   "network")
    # the URI's own endpoint wins over the variable in the message, as for S3 and GCS
    assert "the store at 127.0.0.1:1 cannot" in said(OSError("Connection refused"),
                                                     "toys://b/x?endpoint_override=127.0.0.1:1")
    assert said(OSError("toy: token refused because expired")) == (
        "'toy://b/x': cannot read: the toy token was refused (expired); run `toy login`")
    mid = storage.store_error(OSError("AccessDenied"), "toy://b/x", option="-o", mid_run=True, what="cannot write")
    assert isinstance(mid, MachineError) and str(mid) == (
        "-o 'toy://b/x': cannot write: access denied with the credentials given; check TOY_TOKEN and the "
        f"bucket's grants, {storage.RESUME_HINT}")


def test_a_scheme_pcd_has_no_row_for_gets_the_plain_fixes():
    """A scheme pyarrow may know but pcd has no row for: the default row's fixes, no probe."""
    assert isinstance(storage.store_error(OSError("AccessDenied"), "nosuch://b/x"), StoreError)
    assert str(storage.store_error(OSError("AccessDenied"), "nosuch://b/x")) == (
        "'nosuch://b/x': cannot read: access denied with the credentials given; check the credentials and the "
        "bucket's permissions")
    assert str(storage.store_error(OSError("Could not connect"), "nosuch://b/x")) == (
        "'nosuch://b/x': cannot read: the store cannot be reached (Could not connect); check the endpoint and the "
        "network")
    assert storage.uri_scheme("nosuch:/b/x") is None  # not a known scheme: a local relative path


def test_aliases_say_the_same(monkeypatch):
    """``gcs://`` is ``gs://`` (one row): a denial without credentials names the variable for both."""
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    said = {name: str(storage.store_error(OSError("PERMISSION_DENIED"), f"{name}://b/x")).split(": ", 1)[1]
            for name in ("gs", "gcs")}
    assert said["gs"] == said["gcs"] == ("cannot read: access denied and GOOGLE_APPLICATION_CREDENTIALS is not set; "
                                         "set GOOGLE_APPLICATION_CREDENTIALS to a service account key file, or run "
                                         "where the metadata server gives one")
    names = [name for row in schemes.SCHEMES for name in row.names]
    assert len(names) == len(set(names)) and all(name == name.lower() for name in names)
    assert schemes.scheme_row(None) is schemes.scheme_row("file") and schemes.scheme_row("file").on_disk


def test_no_code_outside_the_table_names_a_scheme():
    """``if scheme == "s3"`` and its kin live only in ``io/schemes.py``; the rest reads rows."""
    root = Path(pcd_cli.__file__).parent
    named = re.compile(r"""scheme\w*\s*(?:==|!=|(?:not\s+)?in\s*[(\[{])|\(\s*["'](?:s3|gs|gcs)["']\s*,""")
    found = [f"{path.relative_to(root)}:{n}: {line.strip()}" for path in sorted(root.rglob("*.py"))
             if path != root / "io" / "schemes.py"
             for n, line in enumerate(path.read_text().splitlines(), 1) if named.search(line)]
    assert found == []
