"""A fake model host and labeler for the server tests: no model, deterministic results, a call log.

The fake labeler gives every decision of a record a label picked from a CRC of its text, with
probability 0.7 (the rest shared evenly); a text containing ``FAIL`` fails alone (as a record the
decoder cannot label), one containing ``CRASH`` makes the whole ``label_batch`` call raise.
``gate`` (a ``threading.Event``), when given, holds every call but the startup warm-up until set;
``entered`` is set once such a call started. ``pass_s`` (with ``pass_chars``), when given, makes
every record cost ``ceil(len(text) / pass_chars)`` forward passes of ``pass_s`` seconds each,
with the labeler's ``between_passes`` (as ``Decoder.between_passes``) called before each pass:
a long text is many passes, as on the real decoder.
"""

from __future__ import annotations

import threading
import time
import zlib

from pcd_cli.errors import CompileError
from pcd_cli.io.output import output_schema
from pcd_cli.results import FieldResult, Record, RecordFailure, RecordResult
from pcd_cli.schema.model import schema_metadata


class FakeLabeler:
    def __init__(self, schema, options, host):
        self.schema = schema
        self.options = options
        self.host = host
        self.forward_passes = 0

    def metadata(self) -> dict[str, str]:
        return {"pcd.model": self.host.model_id, **schema_metadata(self.schema),
                "pcd.prompt_head_sha256": "f" * 64, "pcd.scoring": self.options.scoring}

    def output_schema(self, id_column, id_type, *, all_probs):
        return output_schema(self.schema, id_column, id_type, all_probs=all_probs)

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def label_batch(self, batch):
        self.host.calls.append([(r.id, getattr(r, "text", None)) for r in batch])
        self.host.call_schemas.append(self.schema.name)
        warm_up = [getattr(r, "id", None) for r in batch] == ["warm-up"]
        if not warm_up:
            self.host.entered.set()
        if self.host.gate is not None and not warm_up:
            self.host.gate.wait(30)
        if self.host.delay:
            time.sleep(self.host.delay)
        if any(isinstance(r, Record) and "CRASH" in r.text for r in batch):
            raise RuntimeError("boom")
        if self.host.pass_s and not warm_up:
            texts = [r.text for r in batch if isinstance(r, Record)]
            for _ in range(sum(-(-max(1, len(t)) // self.host.pass_chars) for t in texts)):
                hook = getattr(self, "between_passes", None)
                if hook is not None:
                    hook()
                time.sleep(self.host.pass_s)
                self.forward_passes += 1
            self.host.finished.append([(r.id, getattr(r, "text", None)) for r in batch])
            return [self._one(r) for r in batch]
        self.forward_passes += 2
        return [self._one(r) for r in batch]

    def _one(self, record):
        if isinstance(record, RecordFailure):
            return record
        if "FAIL" in record.text:
            return RecordFailure(record.id, f"record {record.id!r}: too long for the model (fake)")
        fields = []
        for f in self.schema.fields:
            k = len(f.labels)
            label = zlib.crc32((f.name + record.text).encode()) % k
            probs = tuple(0.7 if i == label else 0.3 / (k - 1) for i in range(k))
            fields.append(FieldResult(label=label, value=f.value(label), prob=probs[label], mass=0.9, probs=probs))
        return RecordResult(id=record.id, fields=tuple(fields))


class FakeHost:
    """``ModelHost`` stand-in: ``calls`` logs every ``label_batch`` call's (id, text) pairs;
    ``compiled`` every schema compiled; a schema named ``uncompilable`` raises ``CompileError``."""

    def __init__(self, *, gate: threading.Event | None = None, delay: float = 0.0, load_s: float = 0.0,
                 load_gate: threading.Event | None = None, pass_s: float = 0.0, pass_chars: int = 4096):
        self.calls: list[list] = []
        #: with ``pass_s``: the calls that ran every pass (an abandoned call is in ``calls`` only)
        self.finished: list[list] = []
        self.pass_s = pass_s
        self.pass_chars = pass_chars
        self.call_schemas: list[str] = []
        self.compiled: list[str] = []
        self.gate = gate
        self.delay = delay
        self.load_s = load_s
        self.load_gate = load_gate  # load() waits for it (a test decides when the model is loaded)
        self.entered = threading.Event()
        self.loaded = False

    @property
    def model_id(self) -> str:
        return "fake-model"

    def load(self) -> str:
        time.sleep(self.load_s)
        if self.load_gate is not None:
            self.load_gate.wait(30)
        self.loaded = True
        return self.model_id

    def labeler(self, schema, options):
        if schema.name == "uncompilable":
            raise CompileError("label 'x' of field 'y' needs a token the model lacks (fake)")
        self.compiled.append(schema.name)
        return FakeLabeler(schema, options, self)


if __name__ == "__main__":  # a server over the fake host, for the SIGTERM test: python tests/server/fakes.py
    import logging
    import sys

    from pcd_cli.schema.load import load_schema
    from pcd_cli.server.app import AppConfig
    from pcd_cli.server.main import serve
    from pcd_cli.job import LabelJob
    from pcd_cli.server.service import LabelService

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    service = LabelService(FakeHost(delay=float(sys.argv[1])),
                           {"sms": (load_schema("schemas/sms_spam.yaml"), LabelJob())})
    sys.exit(serve(service, AppConfig(), port=0, shutdown_timeout_s=float(sys.argv[2]),
                   on_bound=lambda host, port: print(port, flush=True)))
