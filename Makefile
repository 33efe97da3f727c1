# The two commands a fresh clone needs:  `make run`  and  `make test`.
SHELL := /bin/bash
VENV ?= $(or $(RAGLINE_VENV),.venv)
BIN := $(VENV)/bin
FULL ?= 0
CORPUS ?= data/corpus
PORT ?= 50051
QUESTIONS ?= data/credibility/*.jsonl
EVAL ?= ../shared/eval/dev.jsonl
EVAL_OUT ?= var/eval-dev

.PHONY: run test setup redis corpus ingest credibility serve eval lint typecheck proto proto-check unit integration bench bench-retrieval bench-backends bench-credibility bench-encode bench-graph bench-ingest bench-generate bench-security bench-writers bench-upload bench-load bench-soak reliability cluster lock clean

## run: install, start Redis if none answers, fetch + ingest the R manuals, train the
##      credibility classifier once (~5 min), serve on :$(PORT)
##      (FULL=1: the whole eval corpus, refman and the texlive samples included)
run: setup redis corpus ingest credibility serve

## test: install, start Redis if none answers, check generated code, lint, type-check, test
test: setup redis proto-check lint typecheck
	$(BIN)/python -m pytest -q --durations=25

setup:
	@RAGLINE_VENV="$(VENV)" scripts/setup.sh

## lock: write constraints.txt from .venv (every package's exact version, which `make setup`
##      installs under); after changing a dependency: RAGLINE_CONSTRAINTS= make test lock
lock:
	@RAGLINE_VENV="$(VENV)" scripts/lock.sh

redis:
	@scripts/ensure_redis.sh

corpus:
	@FULL=$(FULL) scripts/fetch_corpus.sh "$(CORPUS)"

ingest:
	$(BIN)/ragline ingest "$(CORPUS)"

## credibility: train + calibrate the credibility classifier from the ingested index and the
##      committed LLM-written questions ($(QUESTIONS), made by `ragline credibility
##      questions`: training pairs, as the 90 committed are; from 200 on they become the
##      held-out calibration set instead), unless var/models/credibility
##      already holds one calibrated on this code's features (retrain: ragline credibility train)
credibility:
	@$(BIN)/ragline credibility train --if-missing \
	  $(if $(wildcard $(QUESTIONS)),$(foreach f,$(wildcard $(QUESTIONS)),--pairs $(f)) --with-corpus) \
	  || echo "warning: no credibility model" \
	  "(see above); the server filters evidence by the SPLADE score floor instead" >&2

## serve / eval answer with the configuration measured best on the dev set (README, "Which
##      generator model"): Qwen2.5-Coder-1.5B through llama.cpp, evidence from the credibility
##      filter's 0.5 step, 2 sentences per passage in 256 tokens, and every answer read a second
##      time by the model (below 0.7 it becomes INSUFFICIENT_INFO). `ragline serve` alone keeps
##      the library's defaults (SmolLM2, 0.85, no second reading). Quotes stand in for failed
##      answers only (a terse right answer is not swapped for a sentence); a name or number the
##      answer adds must sit within 10 words of a question word in what it cites (the second
##      reading checks the rest). The filter's linear layers run in int8 (top-20 scoring under
##      50 ms on AVX-512; every dev outcome the same as float32). A value set in the
##      environment wins over these.
serve eval: export RAGLINE_GENERATOR_BACKEND ?= llamacpp
serve eval: export RAGLINE_GENERATOR_MODEL ?= packaged:qwen2.5-coder-1.5b-instruct
serve eval: export RAGLINE_GENERATOR_FOCUS_SENTENCES ?= 2
serve eval: export RAGLINE_GENERATOR_MAX_EVIDENCE_TOKENS ?= 256
serve eval: export RAGLINE_GENERATOR_VERIFY_MIN_P ?= 0.7
serve eval: export RAGLINE_CREDIBILITY_THRESHOLD ?= 0.5
serve eval: export RAGLINE_GENERATOR_QUOTE_OFF_QUESTION ?= false
serve eval: export RAGLINE_GENERATOR_KEY_WINDOW ?= 10
serve eval: export RAGLINE_CREDIBILITY_QUANTIZE ?= true

serve:
	$(BIN)/ragline serve --port $(PORT)

## eval: the labelled questions $(EVAL) against an embedded server answering as `make run`
##      does (fetches and ingests the PDFs its corpus.json names); report in $(EVAL_OUT)
eval: setup redis
	$(BIN)/ragline eval --questions $(EVAL) --out $(EVAL_OUT)

proto:
	$(BIN)/python proto/gen.py

proto-check:
	@$(BIN)/python proto/gen.py --check

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck:
	$(BIN)/mypy .

unit: setup
	$(BIN)/python -m pytest -q -m unit

integration: setup redis
	$(BIN)/python -m pytest -q -m integration

bench: setup redis
	$(BIN)/python bench/slice.py

## bench-backends: local vs Qdrant (local mode) on the same encoded chunks of var/index:
##      search latency per mode, R@10 on the dev questions, build time, memory
bench-backends: setup
	$(BIN)/python bench/backends.py

## bench-credibility: classifier latency on 20 passages and accuracy, fp32/int8, by max length
bench-credibility: setup
	$(BIN)/python bench/credibility.py

## bench-graph: the selective graph's build against the full graph's (time, memory, nodes)
bench-graph: setup
	$(BIN)/python bench/graph.py

## bench-encode: SPLADE and MiniLM passages/s and query latency by variant (float32 through
##      sentence-transformers, ragline's paths, bfloat16), with recall on the LLM-written questions
bench-encode: setup
	$(BIN)/python bench/encode.py

## bench-generate: TTFT and tokens/s per generator backend (vLLM in-process, vLLM's OpenAI
##      server, transformers), 1 and 8 concurrent requests
bench-generate: setup
	$(BIN)/python bench/generate.py

## bench-ingest: parsing pages/s (tables off/on, 1 and 2 workers) and peak RSS
bench-ingest: setup
	$(BIN)/python bench/ingest.py

## bench-retrieval: every backend and mode on var/index, the cache over gRPC, synthetic 100k
bench-retrieval: setup redis
	$(BIN)/python bench/retrieval.py

## bench-security: Retrieve over gRPC without auth, with tokens, with TLS (var/index)
bench-security: setup redis
	$(BIN)/python bench/security.py

bench-writers: setup
	$(BIN)/python bench/writers.py

## bench-upload: `ragline upload` of six PDFs to a loopback server, one file at a time
##      against two in flight (--jobs)
bench-upload: setup redis
	$(BIN)/python bench/upload.py

## bench-load: Retrieve on loopback, one process against every role its own process
##      (1/8/32/128 callers, cache hits and misses), what each hop adds, /metrics while loaded
bench-load: setup redis
	$(BIN)/python bench/load.py

## bench-soak: mixed Retrieve/Answer/Ingest load for DURATION s (default 120): p50/p95/p99,
##      errors by code, RSS and fds over time, Redis memory, the knee of a caller ramp
DURATION ?= 120
bench-soak: setup redis
	$(BIN)/python bench/soak.py --duration $(DURATION)

## reliability: the long form of the reliability tier (tests/reliability and the stage
##      faults; their short form runs in `make test`): 20 kill -9 runs each way, 3,000 fuzzed
##      PDFs, 3,000 fuzzed requests, every stage frozen and killed, then a ten-minute soak
reliability: setup redis
	RAGLINE_RELIABILITY=long $(BIN)/python -m pytest -q -m reliability
	$(BIN)/python bench/soak.py --duration 600 --out bench/out/soak-long.json

## cluster: the split deployment on this machine (every role its own process, gateway :$(PORT))
cluster: setup redis
	$(BIN)/ragline cluster --port $(PORT)

clean:
	rm -rf var build *.egg-info .mypy_cache .ruff_cache .pytest_cache
