"""The MLX backend (mlx-lm; on Linux through mlx[cpu]): parity with torch, the oracle, the CLI.

Tiny random-initialised checkpoints are built with transformers, saved to a folder and
loaded by both backends, so both read the very same weights. Tolerances: 1e-4 (float32).
"""

from __future__ import annotations


import json
import sys
from pathlib import Path

import numpy as np
import pytest

from pcd_cli.backends.select import mlx_available, pick_backend
from pcd_cli.decoding.compile import CompiledSchema
from pcd_cli.decoding.decode import Decoder
from pcd_cli.results import Record
from pcd_cli.errors import ModelError
from pcd_cli.backends.conformance import max_oracle_diff
from pcd_cli.schema.load import load_schema

from ..helpers import TEXTS

HAVE_MLX = mlx_available()
needs_mlx = pytest.mark.skipif(not HAVE_MLX, reason="mlx-lm is not installed (pip install 'pcd-cli[mlx]')")
TOL = 1e-4
#: Weight scale of the tiny models: sharp enough that labels differ visibly, mild enough that
#: float32 itself is accurate to well under TOL (at 4x, torch float32 is 9e-5 off its own float64).
SCALE = 2.0
ROOT = Path(__file__).resolve().parents[2]

#: arch -> (transformers config class, model class, extra config)
ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"rope_parameters": {"rope_type": "default", "rope_theta": 50000.0}}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    # two layers, the first one sliding (window 24 < the prompt): the window is exercised
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               {"head_dim": 16, "sliding_window": 24, "query_pre_attn_scalar": 16,
                "layer_types": ["sliding_attention", "full_attention"]}),
}


def _build_tiny(arch: str, folder: Path, seed: int = 0) -> Path:
    import torch
    import transformers

    from pcd_cli.backends.torch_backend import converted_gguf_dir, embedded_gguf_path

    config_cls, model_cls, extra = ARCHS[arch]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(converted_gguf_dir(embedded_gguf_path())))
    config = getattr(transformers, config_cls)(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192, tie_word_embeddings=True,
        **extra)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).float().eval()
    with torch.no_grad():  # sharper than the default init, so probabilities differ visibly
        for p in model.parameters():
            p.mul_(SCALE)
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    return {arch: _build_tiny(arch, tmp_path_factory.mktemp(f"tiny-{arch}")) for arch in ARCHS}


@pytest.fixture(scope="module")
def mlx_backends(tiny_dirs):
    from pcd_cli.backends import load_backend

    return {arch: load_backend(str(d), backend="mlx", device="cpu", dtype="float32") for arch, d in tiny_dirs.items()}


@pytest.fixture(scope="module")
def torch_backends(tiny_dirs):
    from pcd_cli.backends import load_backend

    return {arch: load_backend(str(d), backend="torch", device="cpu", dtype="float32")
            for arch, d in tiny_dirs.items()}


@pytest.fixture(scope="module")
def embedded_mlx():
    from pcd_cli.backends import load_backend

    return load_backend(None, backend="mlx", device="cpu", dtype="float32")


class Recorder:
    """A backend proxy that records the cache calls a decode makes, to replay them elsewhere."""

    def __init__(self, backend):
        self._backend = backend
        self.calls: list[tuple] = []

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def prefill(self, ids, **kwargs):
        self.calls.append(("prefill", list(ids)))
        return self._backend.prefill(ids, **kwargs)

    def truncate(self, cache, length):
        self.calls.append(("truncate", length))
        return self._backend.truncate(cache, length)

    def forward(self, cache, *args):
        out = self._backend.forward(cache, *args)
        self.calls.append(("forward", args, out))
        return out


def _replay_max_diff(calls, backend, *, probs: bool = False) -> tuple[float, int]:
    """Replay recorded calls on ``backend``; largest |log-prob difference| over finite entries
    (``probs``: largest |probability difference| instead)."""
    worst, n, cache = 0.0, 0, None
    for call in calls:
        if call[0] == "prefill":
            cache = backend.prefill(call[1])
        elif call[0] == "truncate":
            backend.truncate(cache, call[1])
        else:
            out = backend.forward(cache, *call[1])
            ref = call[2]
            assert np.array_equal(np.isinf(out), np.isinf(ref))  # padding stays -inf, nothing else
            finite = np.isfinite(ref)
            a, b = (np.exp(out[finite]), np.exp(ref[finite])) if probs else (out[finite], ref[finite])
            worst = max(worst, float(np.abs(a - b).max()))
            n += 1
    return worst, n


def _decode(backend, schema, scoring, *, budget=2048, pack=True, texts=TEXTS, trace=True):
    compiled = CompiledSchema(schema, backend.tokenizer, scoring=scoring, logits_width=backend.logits_width)
    decoder = Decoder(backend, compiled, max_tokens_per_pass=budget, pack_records=pack, trace=trace)
    results = decoder.decode([Record(i, t) for i, t in enumerate(texts)])
    assert backend.cache_length(decoder.cache) == len(compiled.prompt.head_ids)  # the forest KV is cropped away
    return decoder, results


# -- choosing a backend (no mlx needed) -------------------------------------------------------

@pytest.mark.parametrize("apple, installed, expected", [
    (True, True, "mlx"), (True, False, "torch"), (False, True, "torch"), (False, False, "torch")])
def test_auto_picks_mlx_only_on_apple_silicon_with_mlx_lm(monkeypatch, apple, installed, expected):
    import pcd_cli.backends.select as select

    monkeypatch.setattr(select, "is_apple_silicon", lambda: apple)
    monkeypatch.setattr(select, "mlx_available", lambda: installed)
    assert pick_backend("auto") == expected
    assert pick_backend("torch") == "torch" and pick_backend("mlx") == "mlx"
    with pytest.raises(ModelError, match="--backend 'jax': expected auto, torch or mlx"):
        pick_backend("jax")


def test_the_backends_are_named_in_one_place_with_what_fingerprints_their_runs():
    """``backends.select.KINDS`` says which backends exist, which take adapters and which library
    versions a resumable run records (issue #42 item 7): an MLX run records mlx's, not torch's."""
    import importlib.metadata

    from pcd_cli.backends.select import BACKENDS, KINDS, kind_of, library_versions, takes_adapters
    from pcd_cli.cli import BackendKind

    from ..helpers import tiny_backend

    assert BACKENDS == ("auto", "torch", "mlx") and [k.value for k in BackendKind] == list(BACKENDS)
    torch_backend = tiny_backend()
    assert kind_of(torch_backend) is KINDS["torch"]
    assert library_versions(torch_backend) == {"torch": importlib.metadata.version("torch"),
                                               "transformers": importlib.metadata.version("transformers")}

    class MLXStandIn:  # the kind an MLXBackend says (mlx itself need not be installed)
        kind = "mlx"

    assert set(library_versions(MLXStandIn())) == {"mlx", "mlx-lm"}
    assert library_versions(object()) == {}  # a stand-in of no kind records none
    assert takes_adapters(torch_backend) and not takes_adapters(MLXStandIn()) and not takes_adapters(object())
    assert takes_adapters("auto") and takes_adapters("torch") and not takes_adapters("mlx")


def test_nothing_outside_backends_tests_a_backend_class_or_name():
    """No module of ``pcd_cli`` outside ``backends/`` names ``TorchBackend``/``MLXBackend`` in code
    or compares a value with a backend's name: they ask ``backends.select``."""
    import ast
    from pathlib import Path

    import pcd_cli

    root = Path(pcd_cli.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] == "backends":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = {getattr(node, "id", None), getattr(node, "attr", None)}
            if names & {"TorchBackend", "MLXBackend"}:
                found.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.Compare):
                consts = [c for c in ast.walk(node) if isinstance(c, ast.Constant)]
                if any(c.value in ("TorchBackend", "MLXBackend", "torch", "mlx") for c in consts):
                    found.append(f"{path.name}:{node.lineno}")
    assert found == []


def test_backend_mlx_without_mlx_lm_exits_3_with_the_install_command(monkeypatch, tmp_path):
    from ..helpers import pcd

    monkeypatch.setitem(sys.modules, "mlx_lm", None)  # `import mlx_lm` now raises ImportError
    monkeypatch.delitem(sys.modules, "pcd_cli.backends.mlx_backend", raising=False)
    data = tmp_path / "in.jsonl"
    data.write_text('{"text": "hello"}\n')
    result = pcd("label", data, "--schema", ROOT / "schemas/sms_spam.yaml", "-o", tmp_path / "out.parquet",
                 "--backend", "mlx", code=3)
    message = " ".join(result.stderr.split())
    assert "--backend mlx needs mlx-lm" in message
    assert "pip install 'pcd-cli[mlx]'" in message
    assert "Traceback" not in result.stdout + result.stderr


def test_rope_parameters_of_transformers_5_reach_mlx_lm():

    if not HAVE_MLX:
        pytest.skip("mlx-lm is not installed (pip install 'pcd-cli[mlx]')")
    from pcd_cli.backends.mlx_backend import rope_config_overrides

    assert rope_config_overrides({"model_type": "llama", "rope_parameters": {"rope_type": "default",
                                                                             "rope_theta": 100000.0}}) == \
        {"rope_theta": 100000.0, "rope_scaling": None}
    llama3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0}
    assert rope_config_overrides({"model_type": "llama", "rope_parameters": llama3}) == \
        {"rope_theta": 500000.0, "rope_scaling": llama3}
    gemma = {"model_type": "gemma3_text", "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
             "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
    assert rope_config_overrides(gemma) == {"rope_theta": 1e6, "rope_scaling": None,
                                            "rope_local_base_freq": 1e4, "sliding_window_pattern": 6}
    assert rope_config_overrides({"model_type": "qwen2", "rope_theta": 1e6}) == {}  # old-style config


# -- parity with torch -----------------------------------------------------------------------

@needs_mlx
def test_log_softmax_is_accurate_over_a_large_vocabulary():
    """A row-by-row float32 sum over 49,152 columns drifts by ~1e-4 in log space (mlx.core's
    ``logsumexp`` on CPU); the backend's blocked sum must stay near float32's own rounding."""
    import mlx.core as mx

    from pcd_cli.backends.mlx_backend import log_softmax

    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((6, 49_152)) * 3 + 5).astype(np.float32)
    logits[:, 7] = 25.0  # one dominant token, as after a confident prompt
    wide = logits.astype(np.float64)
    reference = wide - wide.max(1, keepdims=True)
    reference -= np.log(np.exp(reference).sum(1, keepdims=True))
    with mx.stream(mx.cpu):
        ours = np.array(log_softmax(mx.array(logits)))
        naive = np.array(mx.array(logits) - mx.logsumexp(mx.array(logits), axis=-1, keepdims=True))
    err, naive_err = np.abs(ours - reference).max(), np.abs(naive - reference).max()
    print(f"log_softmax error: blocked {err:.1e}, mx.logsumexp {naive_err:.1e}")
    assert err < 5e-6
    odd = log_softmax(mx.array(logits[:, :1000]))  # a width that is not a multiple of the block
    assert np.abs(np.array(odd) - (wide[:, :1000] - np.log(np.exp(wide[:, :1000]).sum(1, keepdims=True)))).max() < 5e-6


@needs_mlx
@pytest.mark.parametrize("arch", list(ARCHS))
def test_full_forward_matches_torch(mlx_backends, torch_backends, arch):
    """mlx-lm's own forward on the same weights: same log-probs as transformers (config read alike)."""
    mb, tb = mlx_backends[arch], torch_backends[arch]
    ids = mb.tokenizer.encode("<|im_start|>user\nPlease call me back within 12 hours about my refund, "
                              "the invoice was charged twice.<|im_end|>\n<|im_start|>assistant\n{")
    assert ids == tb.tokenizer.encode(mb.tokenizer.decode(ids))
    assert len(ids) > 24  # past gemma3's sliding window
    diff = np.abs(mb.full_logprobs(ids) - tb.full_logprobs(ids)).max()
    print(f"{arch}: full forward, mlx vs torch {diff:.2e}")
    assert diff < TOL


@needs_mlx
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("scoring", ["marginal", "exact"])
def test_forest_forward_matches_torch(mlx_backends, torch_backends, oracle_schema, arch, scoring):
    """The very forests (ids, positions, masks, kept rows) torch decoded, replayed on MLX."""
    recorder = Recorder(torch_backends[arch])
    _decode(recorder, oracle_schema, scoring)
    worst, n = _replay_max_diff(recorder.calls, mlx_backends[arch])
    print(f"{arch} {scoring}: {n} forest passes, mlx vs torch {worst:.2e}")
    assert n == 2 and worst < TOL


@pytest.mark.full  # make test checks embedded parity end to end (test_pcd_label_mlx_equals_torch_on_sample_data)
@needs_mlx
def test_forest_forward_matches_torch_on_the_embedded_model(embedded_mlx, embedded_backend, oracle_schema):
    """30 layers of float32 in two frameworks, activations up to ~650. Measured 4.9e-5 on
    log-probs and 2.3e-5 on the read probabilities; against a float64 forward torch is 6.4e-5
    off and mlx[cpu] 1.3e-4 (its matmul and attention sums). Before ``log_softmax`` summed in
    blocks, MLX's row sum over the vocabulary alone cost 2e-4 and this test failed."""
    recorder = Recorder(embedded_backend)
    _decode(recorder, oracle_schema, "exact", texts=TEXTS[:1])
    worst_lp, n = _replay_max_diff(recorder.calls, embedded_mlx)
    worst_p, _ = _replay_max_diff(recorder.calls, embedded_mlx, probs=True)
    print(f"embedded: {n} forest passes, mlx vs torch: log-probs {worst_lp:.2e}, probabilities {worst_p:.2e}")
    assert n == 2 and worst_p < TOL and worst_lp < TOL


# -- the decoder on MLX against its own oracle -------------------------------------------------

@needs_mlx
@pytest.mark.parametrize("arch, scoring, pack", [
    *[(arch, scoring, True) for arch in ARCHS for scoring in ("marginal", "exact")],
    ("llama", "marginal", False), ("llama", "exact", False), ("gemma3", "exact", False)])
def test_decoder_matches_oracle_on_mlx(mlx_backends, oracle_schema, arch, scoring, pack):
    backend = mlx_backends[arch]
    decoder, results = _decode(backend, oracle_schema, scoring, pack=pack)
    assert decoder.record_passes == (2 if pack else 2 * len(TEXTS))
    worst = max_oracle_diff(backend, oracle_schema, results, scoring)
    print(f"{arch} {scoring} {'packed' if pack else 'unpacked'}: largest difference from the oracle {worst:.2e}")
    assert worst < TOL


@pytest.mark.full  # ~3 min on mlx[cpu]; make test checks split forests on torch (test_decode) and MLX forests above
@needs_mlx
def test_split_255_label_forest_matches_oracle_on_mlx(mlx_backends):
    """The 255-label field split over many passes (a 64-token budget) on MLX: the same
    probabilities as one whole forest, and each sampled label's unnormalised probability
    (``probs[i] * mass``) equal to the oracle's plain forward over its full text. Labels are
    sampled from the first, middle and last sub-forests (plus the winner) rather than all 255:
    on mlx[cpu] one plain forward over this 5,000-token prompt takes ~10 s, and the decoder's
    normalisation is already checked against the full oracle for the small fields above."""
    from pcd_cli.decoding.oracle import oracle_label_logprobs

    backend = mlx_backends["llama"]
    schema = load_schema(ROOT / "schemas/customs_255.yaml")
    texts = ["Batch of 5,000 titanium hex-flange fasteners for turbine rotors."]
    big_dec, big = _decode(backend, schema, "exact", budget=8192, texts=texts)
    small_dec, small = _decode(backend, schema, "exact", budget=64, texts=texts)
    assert small_dec.record_passes > 2 * big_dec.record_passes  # the forest really is split
    worst_split = max(float(np.abs(np.subtract(a.probs, b.probs)).max())
                      for a, b in zip(big[0].fields, small[0].fields))
    field, result = schema.fields[0], small[0].fields[0]
    assert len(result.probs) == 255
    trace = next(t for t in small[0].traces if t["field"] == field.name)
    lines = [(field.labels.index(line["label"]), line["text"]) for line in trace["lines"]]
    sampled = {0, 1, 127, 128, 253, 254, int(np.argmax(result.probs))}
    oracle = oracle_label_logprobs(backend, trace["context"], field, lines, "exact", labels=sampled)
    ours = np.log(np.asarray(result.probs)) + np.log(result.mass)
    worst = max(abs(ours[i] - oracle[i]) for i in sampled)
    print(f"255 labels, {small_dec.record_passes} passes: split vs whole {worst_split:.2e}, "
          f"log(p*mass) vs oracle on {len(sampled)} labels {worst:.2e}")
    assert worst_split < 1e-5 and worst < TOL


@needs_mlx
def test_caches_are_owned_by_callers_cropped_back_and_passes_counted(mlx_backends):
    backend = mlx_backends["qwen2"]
    head = backend.prefill([1, 2, 3, 4])
    other = backend.prefill([9, 8])
    before = backend.forward_passes
    ids = np.array([5, 6, 7])
    visible = np.tril(np.ones((3, 7), dtype=bool), k=4)
    lp = backend.forward(head, ids, np.array([4, 5, 5]), visible, np.array([0, 2]), np.array([[5, -1], [6, 7]]))
    assert lp.dtype == np.float64 and lp.shape == (2, 2) and lp[0, 1] == -np.inf and np.isfinite(lp[1]).all()
    assert backend.cache_length(head) == 7 and backend.cache_length(other) == 2
    assert backend.forward_passes == before + 1
    backend.truncate(head, 4)
    assert backend.cache_length(head) == 4
    again = backend.forward(head, ids, np.array([4, 5, 5]), visible, np.array([0, 2]), np.array([[5, -1], [6, 7]]))
    assert np.array_equal(again, lp)  # cropping restored the head exactly
    with pytest.raises(ValueError, match=r"visible has shape \(3, 6\), expected \(3, 10\)"):
        backend.forward(head, ids, np.array([4, 5, 6]), np.ones((3, 6), dtype=bool), np.array([0]), np.array([[1]]))


@needs_mlx
def test_generation_matches_torch_greedy(mlx_backends, torch_backends):
    mb, tb = mlx_backends["llama"], torch_backends["llama"]
    ids = mb.tokenizer.encode("<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n")
    new, passes = mb.generate(ids, 6)
    assert (new, passes) == tb.generate(ids, 6)
    assert mb.generate(ids, 6, cache_prefix_len=4) == (new, 6)
    assert mb.generate(ids, 6, cache_prefix_len=4) == (new, 6)  # the shared prefix is not clobbered


# -- options -----------------------------------------------------------------------------------

@needs_mlx
@pytest.mark.parametrize("device, dtype, message", [
    ("cuda", "auto", "--backend mlx --device cuda: the MLX backend runs on the Apple GPU"),
    ("cpu", "float64", "--dtype 'float64': expected auto, float32, bfloat16 or float16"),
])
def test_mlx_refuses_devices_and_dtypes_that_make_no_sense(tiny_dirs, device, dtype, message):
    from pcd_cli.backends import load_backend

    with pytest.raises(ModelError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_backend(str(tiny_dirs["llama"]), backend="mlx", device=device, dtype=dtype)


@needs_mlx
def test_mlx_dtype_is_applied(tiny_dirs):
    from pcd_cli.backends import load_backend

    backend = load_backend(str(tiny_dirs["qwen2"]), backend="mlx", device="cpu", dtype="bfloat16")
    assert backend.dtype_name == "bfloat16" and backend.device == "mlx:cpu"


@needs_mlx
def test_unsupported_architecture_is_a_model_error(tiny_dirs, tmp_path):
    folder = tmp_path / "phi"
    folder.mkdir()
    for f in tiny_dirs["llama"].iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "starcoder2"}))
    from pcd_cli.backends import load_backend

    with pytest.raises(ModelError):
        load_backend(str(folder), backend="mlx", device="cpu", dtype="float32")


# -- the CLI end to end on the embedded model --------------------------------------------------

@needs_mlx
@pytest.mark.full  # 30 s; MLX against torch stays in make test through the conformance and forward tests
@pytest.mark.parametrize("scoring", ["marginal", "exact"])
def test_pcd_label_mlx_equals_torch_on_sample_data(tmp_path, scoring):
    import pyarrow.parquet as pq

    from ..helpers import pcd

    tables = {}
    for kind in ("torch", "mlx"):
        out = tmp_path / f"{kind}.parquet"
        pcd("label", ROOT / "sample_data/sms_spam.jsonl", "--schema", ROOT / "schemas/sms_spam.yaml",
            "--id-field", "id", "--limit", 3, "--scoring", scoring, "--backend", kind, "--device", "cpu",
            "--dtype", "float32", "-o", out, "--quiet")
        tables[kind] = pq.read_table(out).to_pylist()
    assert [r["id"] for r in tables["mlx"]] == [r["id"] for r in tables["torch"]]
    assert [r["is_spam"] for r in tables["mlx"]] == [r["is_spam"] for r in tables["torch"]]
    worst = max(abs(a[c] - b[c]) for a, b in zip(tables["mlx"], tables["torch"])
                for c in ("is_spam__prob", "is_spam__mass"))
    print(f"pcd label {scoring}: mlx vs torch probabilities {worst:.2e}")
    assert worst < TOL  # measured 2.3e-5 (marginal), 1.5e-5 (exact)


# -- the shared conformance suite (pcd_cli.backends.conformance) on MLX -------------------------

#: Families the MLX backend drives; phi3 (its own RoPE classes, longrope) is refused.
MLX_FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma3")


@pytest.fixture(scope="module")
def conformance_root(tmp_path_factory):
    return tmp_path_factory.mktemp("conformance-mlx")


def _load_mlx(folder):
    from pcd_cli.backends import load_backend

    return load_backend(str(folder), backend="mlx", device="cpu", dtype="float32")


def _tokenizer_source():
    from pcd_cli.backends.torch_backend import converted_gguf_dir, embedded_gguf_path

    return converted_gguf_dir(embedded_gguf_path())


@needs_mlx
@pytest.mark.parametrize("family", [f if f in ("llama", "qwen2") else pytest.param(f, marks=pytest.mark.full)
                                    for f in MLX_FAMILIES])  # all five in make test-full
def test_conformance_family_on_mlx(family, conformance_root):
    from pcd_cli.backends import conformance

    checks = conformance.run_family(family, conformance_root / family, _load_mlx, _tokenizer_source())
    for (scoring, packing), check in checks.items():
        print(f"mlx {family:8s} {scoring:8s} {packing:6s} max |pcd - eager torch oracle| = {check.max_diff:.1e} "
              f"({check.passes} passes, longest record {check.longest_record} tokens)")
        assert check.records == len(conformance.TEXTS)
        assert check.max_diff < conformance.TOLERANCE, (family, scoring, packing, check)
        assert check.longest_record > 4 * conformance.WINDOW
    assert checks[("exact", "single")].passes == 2 * len(conformance.TEXTS)
    assert checks[("exact", "packed")].passes == 2


@needs_mlx
@pytest.mark.parametrize("family", ["phi3", "mamba", "jamba", "rwkv"])
def test_mlx_refuses_families_it_cannot_score_exactly(family, tmp_path):
    from pcd_cli.backends import conformance

    refused = family in conformance.REFUSED_FAMILIES
    folder = conformance.build_tiny_model(family, tmp_path / family, _tokenizer_source(), refused=refused)
    with pytest.raises(ModelError, match="cannot score it exactly|scores exactly"):
        _load_mlx(folder)


@needs_mlx
@pytest.mark.parametrize("permutations", [pytest.param(1, marks=pytest.mark.full), 3])  # 3: the types and branches (balanced: 3-label fields)
def test_new_field_types_and_orderings_match_the_oracle_on_mlx(mlx_backends, permutations):
    """Multi-select, nullable, ordinal and integer fields (and --permutations branches) on MLX:
    every decision (each ordering's own, from its trace) against MLX's plain forward passes."""
    from pcd_cli.decoding.oracle import oracle_field
    from pcd_cli.decoding.permute import compile_orderings
    from pcd_cli.schema.load import parse_schema

    from ..decoding.test_field_types import TYPES_SCHEMA

    backend, schema = mlx_backends["llama"], parse_schema(TYPES_SCHEMA)
    orderings = compile_orderings(schema, backend.tokenizer, permutations, scoring="marginal",
                                  logits_width=backend.logits_width) if permutations > 1 else ()
    compiled = orderings[0] if orderings else CompiledSchema(schema, backend.tokenizer, logits_width=backend.logits_width)
    decoder = Decoder(backend, compiled, orderings=orderings, trace=True)
    results = decoder.decode([Record(0, TEXTS[0])])
    worst, checked = 0.0, 0
    for result in results:
        for trace in result.traces:
            field = schema.fields[schema.field_index(trace["field"])]
            lines = [(field.labels.index(line["label"]), line["text"]) for line in trace["lines"]]
            probs, mass = oracle_field(backend, trace["context"], field, lines, "marginal")
            got = np.array([trace["probs"][label] for label in field.labels])
            worst, checked = max(worst, float(np.abs(got - probs).max()), abs(trace["mass"] - mass)), checked + 1
    assert checked == permutations * len(schema.fields)
    print(f"mlx, field types, K={permutations}: largest difference from the oracle {worst:.2e}")
    assert worst < TOL


@needs_mlx
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_decision_features_on_mlx_packed_equal_alone_and_a_plain_forward(family, conformance_root):
    """The linear readout's feature read on MLX (issue #50), by the shared conformance check, and
    against torch's hidden states of the same weights."""
    from pcd_cli.backends import conformance, load_backend

    folder = conformance_root / family
    if not (folder / "config.json").is_file():
        conformance.build_tiny_model(family, folder, _tokenizer_source())
    backend = _load_mlx(folder)
    worst = conformance.check_features(backend)
    assert max(worst.values()) < conformance.FEATURE_TOLERANCE, (family, worst)
    torch_backend = load_backend(str(folder), backend="torch", device="cpu", dtype="float32")
    ids = backend.tokenizer.encode(conformance.TEXTS[0])
    layers = list(range(1, backend.n_layers + 1))
    ours, theirs = backend.full_hidden(ids, [len(ids) - 1], layers), torch_backend.full_hidden(ids, [len(ids) - 1], layers)
    assert np.abs(ours - theirs).max() / np.abs(theirs).max() < 1e-4
