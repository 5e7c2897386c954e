"""What the tests share that is not a fixture: the tiny backends, the oracle schema, the texts and
the one CLI runner. ``conftest.py`` builds its fixtures from these; test files import them from here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

#: the repository's root
ROOT_DIR = Path(__file__).resolve().parents[1]

#: The oracle-test schema of issue #2: a boolean first, shared prefixes, a label that is a
#: prefix of another, labels colliding on their first token.
ORACLE_SCHEMA = {
    "name": "oracle",
    "fields": {
        "urgent": {"type": "boolean", "description": "Whether the customer needs help today"},
        "deadline": {"type": "enum", "description": "Deadline the customer gives",
                     "labels": ["1_HOUR", "12_HOURS", "1_WEEK", "NONE"]},
        "action": {"type": "enum", "description": "What the agent should do",
                   "labels": ["CALL", "CALL BACK", "EMAIL"]},
        "tool": {"type": "enum", "description": "Tool to use", "labels": ["get_weather", "get_time"]},
        "refund": {"type": "boolean", "description": "Whether a refund is asked for"},
    },
}

TEXTS = [
    "Please call me back within 12 hours, my invoice was charged twice and I want a refund.",
    "What time is it in Tokyo right now?",
    "Thanks, all good.",
]


def own_cache(root: Path) -> dict[str, str]:
    """Build the test suite's own home and cache under ``root``; return the variables that select
    them (``HOME``, ``XDG_CACHE_HOME``), for the session fixture of ``conftest.py``.

    A machine's history must never change a test's result (issue #45 kind 5: a ``pcd bench`` that
    measured bfloat16 faster left ``~/.cache/pcd/dtype-speed.json``, and two tests saw an extra
    ``note``). pcd's cache folder (``torch_backend.cache_dir``: ``$XDG_CACHE_HOME/pcd``, else
    ``~/.cache/pcd``) becomes ``<root>/cache/pcd``, empty but for ``models``: a link to the user's
    ``<cache>/pcd/models``, the converted model files, keyed by the GGUF's content (reusing them
    changes no result, and converting the embedded model again would cost ~25 s). The other
    entries of the user's cache folder (other tools' caches: Hugging Face, matplotlib) and of the
    home folder are linked as they are; ``<root>/home/.cache`` is the suite's cache, so a path
    written ``~/.cache/pcd/...`` lands there too. Where the user's locations are is read from the
    current ``HOME`` and ``XDG_CACHE_HOME``.
    """
    import os

    from pcd_cli.backends.torch_backend import cache_dir

    real_home = Path(os.path.expanduser("~"))
    real_pcd = cache_dir()
    home, cache = root / "home", root / "cache"
    (cache / "pcd").mkdir(parents=True, exist_ok=True)
    home.mkdir(parents=True, exist_ok=True)
    try:
        (real_pcd / "models").mkdir(parents=True, exist_ok=True)
        (cache / "pcd" / "models").symlink_to(real_pcd / "models", target_is_directory=True)
    except OSError:  # a read-only user cache: the suite converts into its own
        pass
    for src, dst, skip in ((real_pcd.parent, cache, "pcd"), (real_home, home, ".cache")):
        try:
            entries = list(os.scandir(src))
        except OSError:
            continue
        for entry in entries:
            if entry.name != skip and not (dst / entry.name).exists():
                (dst / entry.name).symlink_to(entry.path)
    (home / ".cache").symlink_to(cache, target_is_directory=True)
    return {"HOME": str(home), "XDG_CACHE_HOME": str(cache)}


def tiny_backend(chat_template: bool = True, seed: int = 0):
    """A 2-layer random-init Llama with the embedded model's tokenizer (float32, CPU)."""
    from transformers import AutoTokenizer

    from pcd_cli.backends.torch_backend import converted_gguf_dir, embedded_gguf_path

    tokenizer = AutoTokenizer.from_pretrained(str(converted_gguf_dir(embedded_gguf_path())))
    if not chat_template:
        tokenizer.chat_template = None
    return tiny_llama_over(tokenizer, seed=seed, name="tiny-random-llama")


def save_tiny_model(folder, *, seed: int = 0, chat_template: bool = True):
    """``tiny_backend(chat_template, seed)`` saved as a model folder (weights and tokenizer) at
    ``folder``, for tests that pass ``--model DIR``; returns the backend."""
    backend = tiny_backend(chat_template=chat_template, seed=seed)
    backend.model.save_pretrained(folder)
    backend.tokenizer._tok.save_pretrained(folder)
    return backend


def tiny_llama_over(tokenizer, *, seed: int = 0, max_positions: int = 8192, name: str = "tiny-random-llama"):
    """A 2-layer random-init Llama (hidden 64, weights x4) over ``tokenizer``, as a float32 CPU
    ``TorchBackend`` named ``name``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from pcd_cli.backends.torch_backend import TorchBackend

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                         tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # sharper than the default init, so probabilities differ visibly
        for p in model.parameters():
            p.mul_(4.0)
    return TorchBackend(model.float().eval(), tokenizer, name)


def pcd(*args, code: int | None = 0, env: dict | None = None, input=None):
    """Run ``pcd ARGS`` in process (typer's ``CliRunner``) and return its result.

    With ``code`` (0 unless told), fail the test unless pcd exits with it, showing stdout, stderr
    and the traceback; with ``code=None``, return whatever happened for the test to check.
    ``env`` is set (a ``None`` value unsets a variable) and ``input`` is fed to stdin for the run.
    """
    from typer.testing import CliRunner

    from pcd_cli.cli import app

    result = CliRunner().invoke(app, [str(a) for a in args], prog_name="pcd", env=env, input=input)
    if code is not None and result.exit_code != code:
        detail = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            import traceback

            detail += "\n" + "".join(traceback.format_exception(result.exception))
        pytest.fail(f"pcd {' '.join(map(str, args))}: exit {result.exit_code}, expected {code}\n{detail}")
    return result


def flat(text: str) -> str:
    """Collapse rich's line wrapping so messages can be matched as phrases."""
    return " ".join(text.split())


#: The keyword task the tune tests learn (one boolean field, decided by one word of the text).
KEYWORD_SCHEMA = {"name": "keyword", "instructions": "Does the message ask for a refund?",
                  "fields": {"refund": {"type": "boolean", "description": "Asks for a refund"}}}
NOUNS = ["order", "ticket", "parcel", "invoice", "booking", "seat", "bag", "meal", "upgrade", "voucher"]


def keyword_rows(n=60):
    """``n`` gold rows of the keyword task: even rows ask for a refund, odd ones do not."""
    rows = []
    for i in range(n):
        noun = NOUNS[i % len(NOUNS)]
        refund = i % 2 == 0
        text = f"please refund my {noun} number {i}" if refund else f"please check my {noun} number {i}"
        rows.append({"id": f"k{i}", "text": text, "refund": refund})
    return rows


def keyword_tune_files(root, rows=30):
    """``root`` with the tiny model (``tiny-model``, seed 6), the keyword schema
    (``keyword.json``) and ``rows`` keyword gold rows (``gold.jsonl``): a tune CLI test's inputs."""
    import orjson

    save_tiny_model(root / "tiny-model", seed=6)
    (root / "keyword.json").write_text(json.dumps(KEYWORD_SCHEMA))
    (root / "gold.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in keyword_rows(rows)))
    return root


#: The hand-collected cases under tests/data/: ``cases.jsonl`` (schema and label cases from public
#: bug reports of similar tools) and the case folders of later rounds (``cases-round2/`` ...), each
#: listed in its own ``cases.jsonl``. Tests are filed under the rule a case tests, not its round.
DATA = Path(__file__).with_name("data")
CASES = {c["id"]: c for c in map(json.loads, (DATA / "cases.jsonl").read_text().splitlines())}


def label_case(backend, case, scoring="marginal"):
    """``(schema, labeler, result)`` of a ``tests/data/cases.jsonl`` case labelled with traces."""
    from pcd_cli.api import Labeler
    from pcd_cli.schema.load import parse_schema

    schema = parse_schema(case["schema"])
    labeler = Labeler(schema, backend=backend, scoring=scoring, trace=True)
    (result,) = list(labeler.label([case["input"]]))
    return schema, labeler, result


def copy_case(name: str, tmp_path, folder: str = "cases-round2"):
    """A writable copy of the case folder ``tests/data/FOLDER/NAME`` (outputs are written next to
    the input); the case must be listed in that folder's ``cases.jsonl``."""
    import shutil

    listed = {json.loads(line)["id"] for line in (DATA / folder / "cases.jsonl").read_text().splitlines()}
    assert name in listed
    return Path(shutil.copytree(DATA / folder / name, tmp_path / name))


def airline_texts(n: int) -> list[str]:
    """The first ``n`` tweet texts of ``sample_data/airline_tweets.jsonl`` (120 there)."""
    rows = [json.loads(line) for line in (ROOT_DIR / "sample_data" / "airline_tweets.jsonl").read_text().splitlines()]
    return [r["text"] for r in rows[:n]]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    """``rows`` as a JSONL file at ``path``; returns ``path``."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def jsonl_rows(path) -> list[dict]:
    """Every line of a JSONL file, parsed."""
    import orjson

    return [orjson.loads(line) for line in Path(path).read_bytes().splitlines()]


def trace_contexts(trace) -> dict[str, str]:
    """Record id -> the context of its first field's trace line (holds the record's text)."""
    out: dict[str, str] = {}
    for row in jsonl_rows(trace):
        out.setdefault(row["record"], row["context"])
    return out


#: Hand-made pcd outputs of the one-field airline schema (``output.output_schema`` and
#: ``results_table``), for eval, compare and calibrate tests that load no model.
AIRLINE = "schemas/airline_sentiment.yaml"
SENTIMENTS = ("NEGATIVE", "NEUTRAL", "POSITIVE")


def airline_schema():
    from pcd_cli.schema.load import load_schema

    return load_schema(Path(__file__).resolve().parents[1] / AIRLINE)


def sentiment_probs(label: int, p: float):
    """Probabilities of the three sentiments: ``p`` on ``label``, the rest shared evenly."""
    import numpy as np

    out = np.full(3, (1 - p) / 2)
    out[label] = p
    return out


def write_sentiment_output(path, rows, schema=None):
    """A pcd output of ``(id, label index, probabilities)`` rows of the one-field airline schema."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pcd_cli.io.output import output_schema, results_table
    from pcd_cli.results import FieldResult, RecordResult
    from pcd_cli.schema.model import schema_metadata

    schema = schema or airline_schema()
    results = [RecordResult(id=rid, fields=(FieldResult(label, SENTIMENTS[label], float(p[label]), 0.8,
                                                        tuple(map(float, p))),)) for rid, label, p in rows]
    metadata = {"pcd.version": "0.1.0", "pcd.model": "fake-model", "pcd.prompt_head_sha256": "h" * 64,
                "pcd.scoring": "marginal", **schema_metadata(schema)}
    arrow = output_schema(schema, "id", pa.string(), all_probs=True).with_metadata(metadata)
    pq.write_table(results_table(results, schema, arrow), path)
    return path


def retrained_labeler(schema, job, host, *, prob: float = 0.9):
    """The "retrained model" of the Label Studio retrain tests: ``tests/server/fakes.py``'s fake
    labeler (same labels) whose chosen label has probability ``prob`` (the fake's own is 0.7), so
    a response tells which model decoded it."""
    from pcd_cli.results import FieldResult, RecordResult

    from .server.fakes import FakeLabeler

    class Retrained(FakeLabeler):
        def _one(self, record):
            out = super()._one(record)
            if not isinstance(out, RecordResult):
                return out
            fields = []
            for f, r in zip(self.schema.fields, out.fields):
                k = len(f.labels)
                probs = tuple(prob if i == r.label else (1 - prob) / (k - 1) for i in range(k))
                fields.append(FieldResult(label=r.label, value=r.value, prob=prob, mass=0.9, probs=probs))
            return RecordResult(id=out.id, fields=tuple(fields))

    return Retrained(schema, job, host)


class FakeFit:
    """Stands in for ``pcd_cli.retrain.fit_on_gold`` in the retrain tests: sleeps
    ``seconds``, writes a file, returns ``before``/``after`` as the holdout figures and the job with
    ``seed`` set to the call's number; ``calls`` keeps ``(method, the gold export read back)``."""

    def __init__(self, before: dict, after: dict, seconds: float = 0.0):
        self.before, self.after, self.seconds, self.calls = before, after, seconds, []

    def __call__(self, method, gold, schema, job, out, store=None):
        import time
        from dataclasses import replace

        from pcd_cli.retrain import Fitted

        self.calls.append((method, json.loads(Path(gold).read_text())))
        time.sleep(self.seconds)
        path = Path(out) / "calibration.json"
        path.write_text(json.dumps({"fit": len(self.calls), "after": self.after}))
        return Fitted(replace(job, seed=len(self.calls)), self.before, self.after, 4, path, own_model=False)


#: A nightly export of the object-storage tests (S3 and GCS): its date partition, two Parquet
#: parts (``export_part``) of tickets, one row without text, and the ``pcd label`` arguments.
EXPORT_DATE = "2026-12-05"
EXPORT_ROWS = [
    [{"id": "t1", "body": "The crew were lovely and we landed early."},
     {"id": "t2", "body": "Lost my bag again, third time this year."},
     {"id": "t3", "body": None}],  # no text: a failed row, in the errors file beside the output
    [{"id": "t4", "body": "Seat was fine, nothing special."},
     {"id": "t5", "body": "Delayed four hours with no information at all."}],
]
EXPORT_ARGS = ("-s", AIRLINE, "--id-field", "id", "--template", "{date}: {body}", "-q")


def export_part(rows: list[dict]) -> bytes:
    """One part of ``EXPORT_ROWS`` as Parquet bytes (``id``, ``body`` strings)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": pa.array([r["id"] for r in rows]), "body": pa.array([r["body"] for r in rows],
                                                                                       pa.string())}), sink)
    return sink.getvalue().to_pybytes()
