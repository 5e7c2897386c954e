"""Half precision on the CPU holds one copy of the weights (issue 51, item 8): a model folder
whose weight files hold float32 is loaded in bfloat16/float16 from a copy converted once per
dtype (``weights_in_dtype``), with the values transformers' own conversion gives, bit for bit.
The peak memory itself is measured by ``benchmarks/dtype_memory.py`` (docs/backends.md)."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors import safe_open

from pcd_cli.backends.torch_backend import cache_dir, load_backend, weights_in_dtype

from ..helpers import save_tiny_model


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-f32")
    save_tiny_model(path, seed=5)
    return path


def _tensors(path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            out |= {k: st.get_tensor(k) for k in st.keys()}
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_loads_a_converted_copy_equal_to_transformers_conversion(folder, dtype):
    original = _tensors(folder)
    assert {t.dtype for t in original.values()} == {torch.float32}
    converted = weights_in_dtype(str(folder), dtype)
    assert converted != str(folder) and str(cache_dir()) in converted
    copy = _tensors(type(folder)(converted))
    assert copy.keys() == original.keys()
    for name, tensor in original.items():
        assert copy[name].dtype == dtype and torch.equal(copy[name], tensor.to(dtype)), name
    # the other files are the folder's own, linked
    assert os.path.realpath(os.path.join(converted, "config.json")) == str((folder / "config.json").resolve())
    # written once: the same folder again, untouched
    stamp = os.stat(os.path.join(converted, "model.safetensors")).st_mtime_ns
    assert weights_in_dtype(str(folder), dtype) == converted
    assert os.stat(os.path.join(converted, "model.safetensors")).st_mtime_ns == stamp
    # the model loaded through it holds what transformers' own conversion of the float32 files holds
    from transformers import AutoModelForCausalLM

    ours = load_backend(str(folder), device="cpu", dtype=str(dtype).removeprefix("torch.")).model.state_dict()
    theirs = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype).state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_float32_and_edited_weights(folder, tmp_path):
    assert weights_in_dtype(str(folder), torch.float32) == str(folder)  # already in the dtype asked for
    assert weights_in_dtype("HuggingFaceTB/SmolLM2-135M", torch.bfloat16) == "HuggingFaceTB/SmolLM2-135M"  # a hub id
    first = weights_in_dtype(str(folder), torch.bfloat16)
    weights = folder / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # the file replaced in place
    again = weights_in_dtype(str(folder), torch.bfloat16)
    assert again != first and _tensors(type(folder)(again)).keys() == _tensors(folder).keys()
