"""What ``--model`` names: a hub id with dots in it (``Qwen/Qwen2.5-0.5B-Instruct``) is tried as a
hub id, a path that does not exist is refused as one, and a hub that cannot be reached exits 3
with the hub's own reason.

From the round-3 cases, tests/data/cases-round3/ (issue #20; formerly tests/test_cases_round3.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pcd_cli.backends.torch_backend import resolve_model
from pcd_cli.errors import ModelError

from ..helpers import pcd

CASE = Path(__file__).parents[1] / "data" / "cases-round3" / "csv-duplicate-header-columns"  # its schema.yaml


def _label(*args):
    return pcd("label", *args, code=None)


@pytest.mark.parametrize("spec", ["Qwen/Qwen2.5-0.5B-Instruct", "meta-llama/Llama-3.1-8B-Instruct",
                                  "microsoft/Phi-3.5-mini-instruct", "mlx-community/Qwen2.5-0.5B-Instruct-4bit"])
def test_hub_ids_with_dots_are_hub_ids(spec):
    assert resolve_model(spec) == (spec, spec)


@pytest.mark.parametrize("spec", ["./missing-model", "models/sub/missing", "/no/such/folder", "weights.bin"])
def test_paths_that_do_not_exist_are_still_refused(spec):
    with pytest.raises(ModelError, match="no such folder or .gguf file"):
        resolve_model(spec)


def test_an_unreachable_hub_id_exits_3_with_the_hubs_reason(tmp_path, monkeypatch):
    import transformers

    def offline(source, *args, **kwargs):  # what transformers raises with no network, at once
        raise OSError(f"We couldn't connect to 'https://huggingface.co' to load the files for {source}, and "
                      "couldn't find them in the cached files.")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", offline)
    (tmp_path / "in.jsonl").write_text(json.dumps({"text": "hello"}) + "\n")
    result = _label(tmp_path / "in.jsonl", "-s", CASE / "schema.yaml", "--model", "Qwen/Qwen2.5-0.5B-Instruct",
                    "-o", tmp_path / "o.parquet")
    assert result.exit_code == 3
    flat = " ".join(result.output.split())
    assert "--model 'Qwen/Qwen2.5-0.5B-Instruct': cannot load it (We couldn't connect to 'https://huggingface.co'" \
        in flat
    assert "no such folder" not in flat
