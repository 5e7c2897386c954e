"""``pcd label --adapter``: an adapter that does not fit the model says so (issue #28 item 2).

Adapters are built with peft on a tiny random Llama folder, as the case
../shared/cases-round4/peft-adapter-config-mismatch builds them on the embedded model (its
``make_adapters.py``; the case itself runs as ``test_case_peft_adapter_config_mismatch``, full).
Exit 3 naming the cause: weights matching no layer, missing or unexpected keys, shapes of
another model, target modules the model lacks, a model folder as ``--adapter``, an adapter
already merged into the ``--model`` folder; a warning for another base model named in the
config and for config keys a newer peft wrote.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from ..helpers import flat, pcd, save_tiny_model

SCHEMA = {"name": "reviews", "fields": {"sentiment": {"type": "enum", "labels": ["NEGATIVE", "NEUTRAL", "POSITIVE"]}}}
TEXTS = ["The parcel arrived broken and support never answered.", "Quick delivery, lovely packaging, thank you!"]
CASE = Path(__file__).resolve().parents[3] / "shared" / "cases-round4" / "peft-adapter-config-mismatch"


def _lora(model, targets=("q_proj", "v_proj")):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=list(targets), init_lora_weights=False))


def _edit_config(folder: Path, **changes) -> None:
    path = folder / "adapter_config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes, indent=2))


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """The case's adapters, made the same way on a tiny model folder (``tiny-model``)."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("adapters")
    base_dir = root / "tiny-model"
    backend = save_tiny_model(base_dir, seed=6)
    torch.manual_seed(0)
    _lora(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)).save_pretrained(root / "good")
    for name in ("newer_peft_config", "renamed_keys", "foreign_targets", "other_base_name", "missing_keys",
                 "unexpected_keys"):
        shutil.copytree(root / "good", root / name)
    _edit_config(root / "newer_peft_config", eva_config=None, corda_config=None, some_future_option=True)
    weights = "adapter_model.safetensors"
    state = load_file(root / "good" / weights)
    save_file({k.replace("model.layers", "model.decoder.layers"): v for k, v in state.items()},
              root / "renamed_keys" / weights, metadata={"format": "pt"})
    save_file({k: v for k, v in state.items() if ".layers.1." not in k}, root / "missing_keys" / weights,
              metadata={"format": "pt"})
    extra = {k.replace(".layers.0.", ".layers.7."): v.clone() for k, v in state.items() if ".layers.0." in k}
    save_file(state | extra, root / "unexpected_keys" / weights, metadata={"format": "pt"})
    small = LlamaForCausalLM(LlamaConfig(vocab_size=len(backend.tokenizer._tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
    _lora(small).save_pretrained(root / "other_size")
    _edit_config(root / "foreign_targets", target_modules=["c_attn", "c_proj"])
    _edit_config(root / "other_base_name", base_model_name_or_path="HuggingFaceTB/SmolLM2-135M")
    merged = _lora(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)).merge_and_unload()
    merged.save_pretrained(root / "merged_model_folder")
    (root / "schema.json").write_text(json.dumps(SCHEMA))
    (root / "input.jsonl").write_bytes(b"".join(orjson.dumps({"id": f"r{i + 1}", "text": t}) + b"\n"
                                                for i, t in enumerate(TEXTS)))
    return root


def _label(root: Path, name: str, *adapter):
    out = root / f"{name}.parquet"
    out.unlink(missing_ok=True)
    result = pcd("label", root / "input.jsonl", "-s", root / "schema.json", "--model", root / "tiny-model",
                 "--device", "cpu", "--all-probs", "-o", out, "--no-progress", *adapter, code=None)
    probs = [dict(r["sentiment__probs"]) for r in pq.read_table(out).to_pylist()] if out.exists() else None
    return result, probs


def _same(a, b, tol=1e-6):
    return all(abs(x[k] - y[k]) < tol for x, y in zip(a, b) for k in x)


def test_a_good_adapter_moves_the_probabilities_and_unknown_config_keys_warn(adapters):
    plain, plain_probs = _label(adapters, "plain")
    good, good_probs = _label(adapters, "good", "--adapter", adapters / "good")
    assert plain.exit_code == 0 and good.exit_code == 0, good.output
    assert not _same(plain_probs, good_probs, tol=1e-3)  # the adapter is applied
    assert "warning" not in good.output.lower()
    newer, newer_probs = _label(adapters, "newer", "--adapter", adapters / "newer_peft_config")
    assert newer.exit_code == 0, newer.output
    text = flat(newer.output)
    import peft

    # eva_config and corda_config are keys this peft knows: only the unknown one is named
    assert f"adapter_config.json has keys peft {peft.__version__} does not know (some_future_option): written " \
           "by a newer peft; they are ignored" in text
    assert _same(newer_probs, good_probs)


def test_an_adapter_for_another_base_model_warns_and_still_applies(adapters):
    _, good_probs = _label(adapters, "good2", "--adapter", adapters / "good")
    result, probs = _label(adapters, "other_base", "--adapter", adapters / "other_base_name")
    assert result.exit_code == 0, result.output
    assert "was made for another base model ('HuggingFaceTB/SmolLM2-135M' in its adapter_config.json), not " \
           "'tiny-model'" in flat(result.output)
    assert _same(probs, good_probs)


@pytest.mark.parametrize(("name", "says"), [
    ("renamed_keys", "the adapter's weights match no layer of the model: its 8 tensors are named like "
                     "base_model.model.model.decoder.layers.0.self_attn.q_proj.lora_A.weight"),
    ("missing_keys", "missing or unexpected keys: 4 of the model's adapter tensors are missing "
                     "(base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"),
    ("unexpected_keys", "missing or unexpected keys: 4 tensors match no layer "
                        "(base_model.model.model.layers.7.self_attn.q_proj.lora_A.weight"),
    ("other_size", "shapes of another model: base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight is "
                   "(4, 32) in the adapter but (4, 64) on this model (8 tensors differ)"),
    ("foreign_targets", "its target modules (c_attn, c_proj) are not layers of 'tiny-model' (its linear layers: "
                        "down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj)"),
    ("merged_model_folder", "no adapter_config.json there: it is a model folder (config.json and weights), not a "
                            "LoRA adapter; a merged model folder (pcd tune without --adapter-only) goes to --model"),
])
def test_an_adapter_that_does_not_fit_exits_3_naming_the_cause(adapters, name, says):
    result, probs = _label(adapters, name, "--adapter", adapters / name)
    assert result.exit_code == 3, result.output
    assert says in flat(result.output)
    assert probs is None and "Traceback" not in result.output
    assert len([line for line in result.output.splitlines() if line.startswith("error:")]) == 1


def test_a_refused_adapter_leaves_the_model_as_it_was(adapters):
    from pcd_cli.backends.torch_backend import load_backend
    from pcd_cli.backends.torch_tune import apply_adapter
    from pcd_cli.errors import ModelError

    backend = load_backend(str(adapters / "tiny-model"), device="cpu", dtype="float32")
    before = {k: v.clone() for k, v in backend.model.state_dict().items()}
    with pytest.raises(ModelError, match="shapes of another model"):
        apply_adapter(backend, adapters / "other_size", str(adapters / "tiny-model"))
    after = backend.model.state_dict()
    assert sorted(after) == sorted(before) and all((after[k] == v).all() for k, v in before.items())
    tuned, said = apply_adapter(backend, adapters / "good", str(adapters / "tiny-model"))
    assert said == [] and tuned.model_id == "tiny-model"


def test_model_name_key_compares_names_not_paths():
    from pcd_cli.backends.tune_folder import model_name_key

    assert model_name_key("HuggingFaceTB/SmolLM2-135M-Instruct") == "smollm2-135m-instruct"
    assert model_name_key("/root/.cache/pcd/models/SmolLM2-135M-Instruct.Q4_1-0123456789abcdef") \
        == "smollm2-135m-instruct"
    assert model_name_key("smollm2-135m-instruct") == model_name_key("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert model_name_key("HuggingFaceTB/SmolLM2-135M") != model_name_key("smollm2-135m-instruct")


@pytest.mark.full  # the case as written: adapters built on the embedded model (about 3 min here)
def test_case_peft_adapter_config_mismatch(tmp_path):
    if not CASE.is_dir():
        pytest.skip("the case folder ../shared/cases-round4 is not here")
    env = dict(os.environ, PCD=str(Path(sys.executable).with_name("pcd")), PY=sys.executable)
    run = subprocess.run(["bash", str(CASE / "run.sh")], capture_output=True, text=True, env=env, timeout=900)
    blocks = {}
    for block in run.stdout.split("=== ")[1:]:
        name, _, rest = block.partition("\n")
        blocks[name.strip()] = rest
    exits = {name: rest.split("exit=")[1].split()[0] for name, rest in blocks.items()}
    assert exits == {"plain": "0", "good": "0", "newer_peft_config": "0", "renamed_keys": "3", "other_size": "3",
                     "foreign_targets": "3", "other_base_name": "0", "merged_model_folder": "3"}, run.stdout
    good = blocks["good"].strip().splitlines()[-1]
    assert blocks["newer_peft_config"].strip().splitlines()[-1] == good
    assert blocks["other_base_name"].strip().splitlines()[-1] == good
    assert blocks["plain"].strip().splitlines()[-1] != good
    assert "written by a newer peft" in blocks["newer_peft_config"]
    assert "match no layer" in blocks["renamed_keys"] and "shapes of another model" in blocks["other_size"]
    assert "c_attn, c_proj" in blocks["foreign_targets"] and "another base model" in blocks["other_base_name"]
    assert "goes to --model" in blocks["merged_model_folder"]
    assert "Traceback" not in run.stdout
