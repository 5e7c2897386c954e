"""``pcd tune``: the training loss reads what the decoder reads (against the brute-force oracle),
only the adapter learns, a tiny model learns a keyword task, the tuned folder labels through
``pcd label`` exactly, the card's provenance, and seeds reproduce."""

from __future__ import annotations

import json

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest
import torch
from pcd_cli.decoding.compile import CompiledSchema
from pcd_cli.decoding.decode import Decoder
from pcd_cli.results import Record
from pcd_cli.decoding.examples import resolve_examples
from pcd_cli.decoding.oracle import oracle_label_logprobs
from pcd_cli.schema.load import parse_schema
from pcd_cli.tune import TuneConfig, card_mismatches, file_sha256, stratified_holdout, tune

from .helpers import ORACLE_SCHEMA, TEXTS, pcd, tiny_backend
from .test_examples import EXAMPLES


#: The oracle schema in three waves: ``refund`` and ``action`` also see the written ``deadline`` line.
WAVES_SCHEMA = dict(ORACLE_SCHEMA, fields={
    **ORACLE_SCHEMA["fields"],
    "refund": dict(ORACLE_SCHEMA["fields"]["refund"], depends_on=["deadline"]),
    "action": dict(ORACLE_SCHEMA["fields"]["action"], depends_on=["deadline"]),
})


def _gold(decoded, schema):
    """Gold labels that differ from the decoder's pick on every field (teacher forcing is visible)."""
    return [[(r.fields[fi].label + 1) % len(f.labels) for fi, f in enumerate(schema.fields)] for r in decoded]


def _step0_against_oracle(backend, schema, scoring, *, examples=(), texts=TEXTS, fields=None):
    """Largest |p_train - p_oracle| over the label probabilities (unnormalised: p * mass) the loss reads."""
    compiled = CompiledSchema(schema, backend.tokenizer, scoring=scoring, logits_width=backend.logits_width,
                              examples=examples)
    decoder = Decoder(backend, compiled, max_tokens_per_pass=512)
    records = [Record(i, t) for i, t in enumerate(texts)]
    gold = _gold(decoder.decode(records), schema)
    from pcd_cli.backends.torch_tune import label_logprobs

    reads = decoder.training_reads(records, gold)
    worst, checked = 0.0, 0
    for record, per_field, labels in zip(records, reads, gold):
        prompt_text, _ = compiled.record_chain(record.id, record.text)
        for fi, (forest, rd) in per_field.items():
            if fields is not None and fi not in fields:
                continue
            field = schema.fields[fi]
            context = prompt_text
            wave = next(k for k, w in enumerate(schema.waves) if fi in w)
            for earlier in schema.waves[:wave]:  # the gold lines of earlier waves, as written
                context += "".join(compiled.written_line(e, labels[e]) for e in earlier)
            expected = oracle_label_logprobs(backend, context, field, list(forest.lines), scoring)
            got = label_logprobs(forest, rd, len(field.labels)).detach().numpy()
            worst = max(worst, float(np.abs(np.exp(got) - np.exp(expected)).max()))
            checked += 1
    return worst, checked


@pytest.mark.parametrize("scoring", ["marginal", "exact"])
@pytest.mark.parametrize("with_examples", [False, True])
def test_step0_loss_reads_equal_the_oracle_on_a_tiny_model(scoring, with_examples):
    backend = tiny_backend(seed=3)
    schema = parse_schema(dict(WAVES_SCHEMA, examples=EXAMPLES) if with_examples else WAVES_SCHEMA)
    assert len(schema.waves) == 3  # urgent; deadline, tool; action, refund
    examples = resolve_examples(schema.examples) if with_examples else ()
    worst, checked = _step0_against_oracle(backend, schema, scoring, examples=examples)
    assert checked == len(TEXTS) * len(schema.fields)
    assert worst < 1e-5


@pytest.mark.full  # make test: every combination on a tiny model (test_step0_loss_reads_equal_the_oracle_on_a_tiny_model)
@pytest.mark.parametrize("scoring", ["marginal", "exact"])
def test_step0_loss_reads_equal_the_oracle_on_the_embedded_model(embedded_backend, scoring):
    schema = parse_schema(dict(WAVES_SCHEMA, examples=EXAMPLES))
    # a sample: one record, the first field (wave 0) and a depends_on field (wave 2, gold lines written)
    worst, checked = _step0_against_oracle(embedded_backend, schema, scoring, texts=TEXTS[:1],
                                           examples=resolve_examples(schema.examples),
                                           fields={schema.field_index("urgent"), schema.field_index("refund")})
    assert checked == 2
    assert worst < 1e-5


def test_one_step_changes_only_adapter_weights():
    from pcd_cli.backends.torch_tune import LoraTrainer, field_loss

    backend = tiny_backend(seed=4)
    base = {k: v.detach().clone() for k, v in backend.model.named_parameters()}
    trainer = LoraTrainer(backend, rank=4, lr=1e-2, seed=0)
    adapter = {k: v.detach().clone() for k, v in backend.model.named_parameters() if "lora_" in k}
    assert adapter and trainer.trainable_parameters == sum(v.numel() for v in adapter.values())
    schema = parse_schema(ORACLE_SCHEMA)
    decoder = Decoder(backend, CompiledSchema(schema, backend.tokenizer, logits_width=backend.logits_width))
    reads = decoder.training_reads([Record(0, TEXTS[0])], [[0, 1, 2, 0, 1]])
    trainer.step([field_loss(forest, rd, len(schema.fields[fi].labels), [0, 1, 2, 0, 1][fi])
                  for fi, (forest, rd) in reads[0].items()])
    after = dict(backend.model.named_parameters())
    for name, value in after.items():
        if "lora_" in name:
            continue
        key = name.replace("base_layer.", "")
        assert torch.equal(value, base[key]), name
    changed = [k for k, v in adapter.items() if not torch.equal(after[k], v)]
    assert len(changed) >= len(adapter) // 2  # lora_B starts at 0 and moves first; lora_A moves from step 2


KEYWORD_SCHEMA = {"name": "keyword", "instructions": "Does the message ask for a refund?",
                  "fields": {"refund": {"type": "boolean", "description": "Asks for a refund"}}}
NOUNS = ["order", "ticket", "parcel", "invoice", "booking", "seat", "bag", "meal", "upgrade", "voucher"]


def _keyword_rows(n=60):
    rows = []
    for i in range(n):
        noun = NOUNS[i % len(NOUNS)]
        refund = i % 2 == 0
        text = f"please refund my {noun} number {i}" if refund else f"please check my {noun} number {i}"
        rows.append({"id": f"k{i}", "text": text, "refund": refund})
    return rows


def test_a_tiny_model_learns_a_keyword_task():
    backend = tiny_backend(seed=6)
    schema = parse_schema(KEYWORD_SCHEMA)
    rows = _keyword_rows()
    records = [Record(r["id"], r["text"]) for r in rows]
    labels = [[0 if r["refund"] else 1] for r in rows]
    result, _ = tune(backend, schema, records, labels, TuneConfig(epochs=10, lr=1e-2, rank=4, holdout=0.25))
    before, best = result.epochs[0].holdout["refund"], result.epochs[result.best_epoch].holdout["refund"]
    assert result.holdout_rows == 16 and result.train_rows == 44  # 8 of each label (round(7.5) = 8)
    assert before.accuracy < 0.8
    assert best.accuracy == 1.0
    assert best.nll < before.nll


def test_stratified_holdout_is_seeded_and_keeps_every_label():
    labels = [0] * 30 + [1] * 10 + [2] * 2
    a, b = stratified_holdout(labels, 0.2, 7), stratified_holdout(labels, 0.2, 7)
    assert a.tolist() == b.tolist()
    assert sorted(labels[i] for i in a) == [0] * 6 + [1] * 2 + [2]
    assert stratified_holdout(labels, 0.2, 8).tolist() != a.tolist()
    assert stratified_holdout(labels, 0.0, 7).tolist() == []


@pytest.fixture(scope="module")
def tune_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("tune")
    backend = tiny_backend(seed=6)
    model_dir = root / "tiny-model"
    backend.model.save_pretrained(model_dir)
    backend.tokenizer._tok.save_pretrained(model_dir)
    schema = root / "keyword.json"
    schema.write_text(json.dumps(KEYWORD_SCHEMA))
    gold = root / "gold.jsonl"
    gold.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in _keyword_rows(40)))
    fresh = root / "fresh.jsonl"
    fresh.write_bytes(b"".join(orjson.dumps({"id": f"n{i}", "text": t}) + b"\n" for i, t in enumerate(
        ["please refund my kettle number 99", "please check my kettle number 98"])))
    return {"root": root, "model": str(model_dir), "schema": schema, "gold": gold, "fresh": fresh}


def _tune_cli(files, out, *extra):
    result = pcd("tune", str(files["gold"]), "-s", str(files["schema"]), "-o", str(out),
                 "--model", files["model"], "--device", "cpu", "--epochs", "2", "--lr", "5e-3",
                 "--rank", "4", "--no-progress", *map(str, extra), code=None)
    assert result.exit_code == 0, result.output
    return result


def test_tuned_folder_labels_through_pcd_label_and_matches_the_oracle(tune_files):
    from pcd_cli.backends import load_backend
    from pcd_cli.decoding.oracle import oracle_field

    out = tune_files["root"] / "tuned"
    result = _tune_cli(tune_files, out)
    assert "pcd tune: holdout (8 rows" in result.output and "--model" in result.output
    card = json.loads((out / "pcd-tune.json").read_text())
    assert card["kind"] == "merged" and card["gold_sha256"] == file_sha256(tune_files["gold"])
    assert card["rows_used"] == 40 and card["train_rows"] == 32 and card["holdout_rows"] == 8
    assert card["hyperparameters"]["rank"] == 4 and len(card["epochs"]) == 3
    assert card["epochs"][0]["train_loss"] is None and card["epochs"][1]["train_loss"] > 0
    labelled = tune_files["root"] / "tuned.parquet"
    run = pcd("label", str(tune_files["fresh"]), "-s", str(tune_files["schema"]), "--model", str(out),
              "--device", "cpu", "--id-field", "id", "-o", str(labelled), "--all-probs", "--trace",
              str(tune_files["root"] / "tuned.trace.jsonl"), "--no-progress", code=None)
    assert run.exit_code == 0, run.output
    assert "tuned for another" not in run.output
    table = pq.read_table(labelled)
    meta = {k.decode(): v.decode() for k, v in table.schema.metadata.items()}
    assert meta["pcd.tuned"] == "tuned model tuned" and len(meta["pcd.tune_card_sha256"]) == 64
    assert card["schema_sha256"] == meta["pcd.schema_sha256"]
    assert card["prompt_head_sha256"] == meta["pcd.prompt_head_sha256"]
    backend = load_backend(str(out), device="cpu", dtype="float32")
    schema = parse_schema(KEYWORD_SCHEMA)
    traces = [json.loads(line) for line in (tune_files["root"] / "tuned.trace.jsonl").read_text().splitlines()]
    for row, trace in zip(table.to_pylist(), traces):
        field = schema.fields[0]
        lines = [(field.labels.index(l["label"]), l["text"]) for l in trace["lines"]]
        probs, mass = oracle_field(backend, trace["context"], field, lines, "marginal")
        assert row["refund__prob"] == pytest.approx(probs.max(), abs=1e-5)
        assert row["refund__mass"] == pytest.approx(mass, abs=1e-5)
    # labelling with another scoring than the one trained warns
    warned = pcd("label", str(tune_files["fresh"]), "-s", str(tune_files["schema"]), "--model",
                 str(out), "--device", "cpu", "--scoring", "exact", "-o",
                 str(tune_files["root"] / "exact.parquet"), "--no-progress", code=None)
    assert warned.exit_code == 0, warned.output
    assert "tuned model tuned was tuned for another scoring mode: trained for 'marginal', labelling with 'exact'" \
        in " ".join(warned.output.split())


def test_adapter_only_applies_on_its_base_like_the_merged_folder(tune_files):
    merged, adapter = tune_files["root"] / "m", tune_files["root"] / "a"
    _tune_cli(tune_files, merged, "--epochs", "1")
    _tune_cli(tune_files, adapter, "--epochs", "1", "--adapter-only")
    assert (adapter / "adapter_config.json").is_file() and not (adapter / "config.json").is_file()
    assert json.loads((adapter / "pcd-tune.json").read_text())["kind"] == "adapter"
    tables = []
    for extra in (["--model", str(merged)], ["--model", tune_files["model"], "--adapter", str(adapter)]):
        out = tune_files["root"] / f"{len(tables)}.parquet"
        run = pcd("label", str(tune_files["fresh"]), "-s", str(tune_files["schema"]), *extra,
                  "--device", "cpu", "-o", str(out), "--all-probs", "--no-progress", code=None)
        assert run.exit_code == 0, run.output
        tables.append(pq.read_table(out).to_pylist())
    for a, b in zip(*tables):
        assert a["refund"] == b["refund"]
        assert a["refund__prob"] == pytest.approx(b["refund__prob"], abs=1e-5)
    bad = pcd("label", str(tune_files["fresh"]), "-s", str(tune_files["schema"]), "--model",
              tune_files["model"], "--adapter", str(merged), "--device", "cpu", "-o",
              str(tune_files["root"] / "bad.parquet"), "--no-progress", code=None)
    assert bad.exit_code == 3 and "no adapter_config.json" in bad.output


def test_seed_reproduces_the_adapter():
    schema = parse_schema(KEYWORD_SCHEMA)
    rows = _keyword_rows(24)
    records = [Record(r["id"], r["text"]) for r in rows]
    labels = [[0 if r["refund"] else 1] for r in rows]
    states = []
    for seed in (1, 1, 2):
        _, trainer = tune(tiny_backend(seed=6), schema, records, labels,
                          TuneConfig(epochs=1, lr=5e-3, rank=4, seed=seed, holdout=0.0))
        states.append(trainer.adapter_state())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert not all(torch.equal(states[0][k], states[2][k]) for k in states[0])


def test_card_mismatches_name_what_differs():
    card = {"schema_sha256": "a", "prompt_head_sha256": "h", "scoring": "marginal"}
    same = {"pcd.schema_sha256": "a", "pcd.prompt_head_sha256": "h", "pcd.scoring": "marginal"}
    assert card_mismatches(card, same) == []
    assert card_mismatches(card, dict(same, **{"pcd.prompt_head_sha256": "x"})) == [
        "prompt head (instructions, catalog, examples): trained for 'h', labelling with 'x'"]


def test_tune_refuses_a_gold_file_without_schema_columns(tune_files, tmp_path):
    gold = tmp_path / "g.jsonl"
    gold.write_text('{"id": "a", "text": "hello", "other": 1}\n')
    result = pcd("tune", str(gold), "-s", str(tune_files["schema"]), "-o", str(tmp_path / "o"),
                 "--model", tune_files["model"], "--device", "cpu", "--no-progress", code=None)
    assert result.exit_code == 2
    assert "no column for any field of the schema (refund)" in " ".join(result.output.split())


def test_tuned_folder_loads_on_mlx_with_the_same_labels(tune_files):
    pytest.importorskip("mlx_lm")
    out = tune_files["root"] / "for-mlx"
    _tune_cli(tune_files, out, "--epochs", "1")
    tables = {}
    for kind in ("torch", "mlx"):
        path = tune_files["root"] / f"{kind}.parquet"
        run = pcd("label", str(tune_files["fresh"]), "-s", str(tune_files["schema"]), "--model", str(out),
                  "--backend", kind, "--device", "cpu", "--dtype", "float32", "-o", str(path),
                  "--all-probs", "--no-progress", code=None)
        assert run.exit_code == 0, run.output
        tables[kind] = pq.read_table(path).to_pylist()
    for a, b in zip(tables["torch"], tables["mlx"]):
        assert a["refund"] == b["refund"]
        assert a["refund__prob"] == pytest.approx(b["refund__prob"], abs=1e-4)
        assert a["refund__mass"] == pytest.approx(b["refund__mass"], abs=1e-4)
