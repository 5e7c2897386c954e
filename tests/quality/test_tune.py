"""``pcd tune``: the training loss reads what the decoder reads (against the brute-force oracle),
only the adapter learns, a tiny model learns a keyword task, the tuned folder labels through
``pcd label`` exactly, the card's provenance, and seeds reproduce."""

from __future__ import annotations

import json
from dataclasses import replace

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
from pcd_cli.backends.tune_folder import card_mismatches
from pcd_cli.tune import TuneConfig, file_sha256, stratified_holdout, tune

from ..helpers import (KEYWORD_SCHEMA, ORACLE_SCHEMA, TEXTS, keyword_rows, pcd, save_tiny_model,
                      tiny_backend)
from ..decoding.test_examples import EXAMPLES


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


@pytest.mark.parametrize("scoring", ["marginal", "exact"])
def test_step0_permutation_reads_equal_the_oracle_for_every_ordering(scoring):
    """``pcd tune --permutations K``: each ordering's branch reads what the oracle reads on that
    ordering's full prompt (the labels listed after the record in its order) with the gold
    lines of earlier waves written."""
    from pcd_cli.backends.torch_tune import label_logprobs
    from pcd_cli.decoding.permute import compile_orderings

    backend = tiny_backend(seed=3)
    fields = ORACLE_SCHEMA["fields"]  # two waves, labels of 2 and 3: 6 orderings are balanced (issue #45)
    schema = parse_schema(dict(ORACLE_SCHEMA, fields={"urgent": fields["urgent"], "refund": fields["refund"],
                                                      "action": dict(fields["action"], depends_on=["urgent"])}))
    orderings = compile_orderings(schema, backend.tokenizer, 6, scoring=scoring, logits_width=backend.logits_width)
    decoder = Decoder(backend, orderings[0], orderings=orderings, max_tokens_per_pass=1024)
    records = [Record(i, t) for i, t in enumerate(TEXTS[:2])]
    gold = _gold(decoder.decode(records), schema)
    with pytest.raises(ValueError, match="training_reads_by_ordering"):
        decoder.training_reads(records, gold)
    reads = decoder.training_reads_by_ordering(records, gold)
    worst, checked, contexts = 0.0, 0, set()
    for record, per_ordering, labels in zip(records, reads, gold):
        assert len(per_ordering) == 6
        for compiled, per_field in zip(orderings, per_ordering):
            prompt_text, _ = compiled.record_chain(record.id, record.text)
            contexts.add(prompt_text)
            for fi, (forest, rd) in per_field.items():
                field = schema.fields[fi]
                wave = next(k for k, w in enumerate(schema.waves) if fi in w)
                context = prompt_text + "".join(compiled.written_line(e, labels[e])
                                                for earlier in schema.waves[:wave] for e in earlier)
                expected = oracle_label_logprobs(backend, context, field, list(forest.lines), scoring)
                got = label_logprobs(forest, rd, len(field.labels)).detach().numpy()
                worst = max(worst, float(np.abs(np.exp(got) - np.exp(expected)).max()))
                checked += 1
    assert checked == 2 * 6 * len(schema.fields) and len(contexts) == 2 * 6  # each ordering its own prompt
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


def test_field_loss_adds_the_gold_full_vocabulary_nll_times_the_mass_weight():
    from pcd_cli.backends.torch_tune import field_loss, label_logprobs

    backend = tiny_backend(seed=4)
    schema = parse_schema(ORACLE_SCHEMA)
    decoder = Decoder(backend, CompiledSchema(schema, backend.tokenizer, logits_width=backend.logits_width))
    with torch.no_grad():
        forest, rd = decoder.training_reads([Record(0, TEXTS[0])], [[0, 1, 2, 0, 1]])[0][2]
    lp = label_logprobs(forest, rd, len(schema.fields[2].labels)).numpy().astype(np.float64)
    ce = np.logaddexp.reduce(lp) - lp[1]  # -log p(gold) over the labels
    assert float(field_loss(forest, rd, len(lp), 1)) == pytest.approx(ce, rel=1e-5)
    assert float(field_loss(forest, rd, len(lp), 1, 0.5)) == pytest.approx(ce - 0.5 * lp[1], rel=1e-5)
    assert -lp[1] > 5  # a random model's mass is tiny: the full-vocabulary term is large


def _gold_probability_after_steps(mass_weight: float, steps: int = 4):
    """Mean over 8 keyword rows of (gold's full-vocabulary probability q, its share p among the
    labels), before and after ``steps`` full-batch steps on a tiny model."""
    from pcd_cli.backends.torch_tune import LoraTrainer, field_loss, label_logprobs

    backend = tiny_backend(seed=6)
    schema = parse_schema(KEYWORD_SCHEMA)
    rows = keyword_rows(8)
    records = [Record(r["id"], r["text"]) for r in rows]
    gold = [[0 if r["refund"] else 1] for r in rows]
    trainer = LoraTrainer(backend, rank=4, lr=1e-2, seed=0)
    decoder = Decoder(backend, CompiledSchema(schema, backend.tokenizer, logits_width=backend.logits_width))

    def measure():
        with torch.no_grad():
            lp = np.array([label_logprobs(*r[0], 2).numpy() for r in decoder.training_reads(records, gold)])
        q = np.exp(lp[np.arange(len(gold)), [g[0] for g in gold]])
        return float(q.mean()), float((q / np.exp(lp).sum(1)).mean())

    before = measure()
    for _ in range(steps):
        reads = decoder.training_reads(records, gold)
        trainer.step([field_loss(*r[0], 2, g[0], mass_weight) for r, g in zip(reads, gold)])
    return before, measure()


def test_the_mass_term_raises_the_gold_labels_full_vocabulary_probability():
    (q0, p0), (q_ce, p_ce) = _gold_probability_after_steps(0.0)
    (q0_again, _), (q_mass, p_mass) = _gold_probability_after_steps(1.0)
    assert q0 == q0_again and q0 < 1e-5  # the random model puts ~1e-6 on the gold line
    assert p_ce > p0 and p_mass > p0  # both raise the gold label's share among the labels
    assert q_mass > 1000 * q0  # measured: 1.5e-6 -> 0.030
    assert q_mass > 100 * q_ce  # the renormalised loss alone: 1.5e-6 -> 1.8e-5


def test_a_tiny_model_learns_a_keyword_task():
    backend = tiny_backend(seed=6)
    # the raw record (record_quoting none): this tiny random model's learning curve (lr, epochs) was
    # measured on it; tune on the quoted prompt is the default every other test here runs
    schema = parse_schema({**KEYWORD_SCHEMA, "record_quoting": "none"})
    rows = keyword_rows()
    records = [Record(r["id"], r["text"]) for r in rows]
    labels = [[0 if r["refund"] else 1] for r in rows]
    # the cross-entropy alone: on a random model the mass term (mass ~1e-6, 13 nats) outweighs it for
    # the first epochs (test_the_mass_term_raises_the_gold_labels_full_vocabulary_probability)
    result, _ = tune(backend, schema, records, labels,
                     TuneConfig(epochs=10, lr=1e-2, rank=4, holdout=0.25, mass_weight=0.0))
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
    model_dir = root / "tiny-model"
    save_tiny_model(model_dir, seed=6)
    schema = root / "keyword.json"
    schema.write_text(json.dumps(KEYWORD_SCHEMA))
    gold = root / "gold.jsonl"
    gold.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in keyword_rows(40)))
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


def test_tune_writes_the_calibration_that_pcd_label_applies(tune_files):
    from pcd_cli.quality.calibration import Calibration

    merged, adapter = tune_files["root"] / "cal-m", tune_files["root"] / "cal-a"
    _tune_cli(tune_files, merged, "--epochs", "1", "--holdout", "0.5")  # 20 holdout rows
    _tune_cli(tune_files, adapter, "--epochs", "1", "--holdout", "0.5", "--adapter-only")
    card = json.loads((merged / "pcd-tune.json").read_text())
    cal = Calibration.load(merged / "pcd-calibration.json")
    entry = card["calibration"]["fields"]["refund"]
    assert card["calibration"]["file"] == "pcd-calibration.json" and cal.model == "cal-m"
    # 20 rows for 2 labels, fewer than 10 per label: a temperature alone, biases 0
    assert entry["method"] == "temperature" and cal.fields["refund"].biases == (0.0, 0.0)
    assert entry["temperature"] == cal.fields["refund"].temperature and cal.fields["refund"].n == 20
    assert Calibration.load(adapter / "pcd-calibration.json").model == "tiny-model"  # the adapter's base

    def label(name, *extra):
        out = tune_files["root"] / f"{name}.parquet"
        run = pcd("label", str(tune_files["fresh"]), "-s", str(tune_files["schema"]), *extra, "--device", "cpu",
                  "--id-field", "id", "-o", str(out), "--all-probs", "--no-progress", code=None)
        assert run.exit_code == 0, run.output
        table = pq.read_table(out)
        return table.to_pylist(), {k.decode(): v.decode() for k, v in table.schema.metadata.items()}

    auto, auto_meta = label("auto", "--model", str(merged))
    given, given_meta = label("given", "--model", str(merged), "--calibration", str(merged / "pcd-calibration.json"))
    raw, raw_meta = label("raw", "--model", str(merged), "--no-calibration")
    assert auto_meta["pcd.calibration_sha256"] == given_meta["pcd.calibration_sha256"] == cal.sha256
    assert "pcd.calibration_sha256" not in raw_meta and "refund__raw_prob" not in raw[0]
    for a, g, r in zip(auto, given, raw):
        assert a["refund__probs"] == g["refund__probs"]
        assert a["refund__raw_prob"] == pytest.approx(r["refund__prob"], abs=1e-6)
        expected = cal.fields["refund"].apply(np.array([p for _, p in r["refund__probs"]]))
        assert [p for _, p in a["refund__probs"]] == pytest.approx(expected.tolist(), abs=1e-6)
    via_adapter, meta = label("adapter", "--model", tune_files["model"], "--adapter", str(adapter))
    assert meta["pcd.calibration_sha256"] == Calibration.load(adapter / "pcd-calibration.json").sha256
    assert "refund__raw_prob" in via_adapter[0]
    both = pcd("label", str(tune_files["fresh"]), "-s", str(tune_files["schema"]), "--model", str(merged),
               "--no-calibration", "--calibration", str(merged / "pcd-calibration.json"), "--device", "cpu",
               "-o", str(tune_files["root"] / "both.parquet"), "--no-progress", code=None)
    assert both.exit_code == 2 and "exclude each other" in both.output


def test_fit_trusted_uses_a_temperature_alone_when_rows_are_few():
    from pcd_cli.quality.calibration import fit_temperature_biases, fit_trusted

    rng = np.random.default_rng(0)
    labels = tuple("abcdefg")
    few_gold = rng.integers(0, 7, 18)
    few = np.full((18, 7), 0.02)
    few[np.arange(18), few_gold] = 0.88  # over-confident where right...
    few[:6] = np.roll(few[:6], 1, axis=1)  # ...and wrong on a third of the rows
    fc = fit_trusted("intent", labels, few, few_gold)
    assert fc.cv["method"] == "temperature" and fc.biases == (0.0,) * 7
    assert "18 rows for 7 labels, fewer than 10 per label" in fc.cv["reason"]
    assert fc.temperature == pytest.approx(fit_temperature_biases(few, few_gold, biases=False)[0])
    assert fc.temperature > 1  # softens
    # 400 rows of two labels whose probabilities lean to "a" by a factor 4: the biases pay off
    gold = rng.integers(0, 2, 400)
    signal = np.where(gold == 0, 0.75, 0.25) + rng.normal(0, 0.1, 400)
    p_a = np.clip(4 * signal / (4 * signal + 1 - signal), 0.01, 0.99)
    probs = np.stack([p_a, 1 - p_a], axis=1)
    fc = fit_trusted("spam", ("a", "b"), probs, gold)
    assert fc.cv["method"] == "temperature+biases"
    assert fc.cv["nll_by_method"]["temperature+biases"] < fc.cv["nll_by_method"]["temperature"]
    assert fc.biases[0] < fc.biases[1]  # pulls back the lean to "a"
    assert fc.cv["after"]["nll"] < fc.cv["before"]["nll"]


def test_seed_reproduces_the_adapter():
    schema = parse_schema(KEYWORD_SCHEMA)
    rows = keyword_rows(24)
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
    card = dict(card, hyperparameters={"permutations": 2})
    assert card_mismatches(card, dict(same, **{"pcd.permutations": json.dumps({"k": 2, "orders": {}})})) == []
    assert card_mismatches(card, same) == ["label orderings (--permutations): trained for 2, labelling with 1"]


def test_tune_over_label_orderings_trains_every_branch():
    # the raw record (record_quoting none): this tiny random model's learning curve (lr, epochs) was
    # measured on it; tune on the quoted prompt is the default every other test here runs
    schema = parse_schema({**KEYWORD_SCHEMA, "record_quoting": "none"})
    rows = keyword_rows(24)
    records = [Record(r["id"], r["text"]) for r in rows]
    labels = [[0 if r["refund"] else 1] for r in rows]
    config = TuneConfig(epochs=3, lr=1e-2, rank=4, holdout=0.5, mass_weight=0.0, permutations=2)
    result, _ = tune(tiny_backend(seed=6), schema, records, labels, config)
    plain, _ = tune(tiny_backend(seed=6), schema, records, labels, replace(config, permutations=1))
    # two branches per record fill the same token budget sooner: two packed groups per epoch, not one
    assert result.train_rows == 12 and (result.steps, plain.steps) == (6, 3)
    assert result.epochs[0].holdout["refund"].nll != plain.epochs[0].holdout["refund"].nll  # another prompt
    assert result.epochs[3].train_loss < result.epochs[1].train_loss  # measured: 1.75 -> 1.22
    assert result.best_epoch == 3  # holdout NLL 1.178 -> 0.745 (holdout labelled with both orderings combined)
    assert result.epochs[3].holdout["refund"].nll < 0.8 * result.epochs[0].holdout["refund"].nll
    probs, gold = result.holdout_predictions[0]
    assert probs.shape == (12, 2) and np.allclose(probs.sum(1), 1)


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
