# Two entry points for a fresh machine: `make run` and `make test`. Each creates .venv with the
# Python a user has (PYTHON, CPython 3.11 to 3.13: the Pythons the lock is checked for; another
# is refused before any venv is made) and installs servelab into it against the lock (LOCK),
# then checks that every distribution servelab runs on is at a locked version.
# `make test-latest` checks the newest versions.
PYTHON ?= python3
PYTHON_VERSION := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
SUPPORTED_PYTHONS := 3.11 3.12 3.13
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.servelab-installed-$(PYTHON_VERSION)
REFUSED = servelab installs on CPython $(subst $() ,$(comma) ,$(SUPPORTED_PYTHONS)), and PYTHON=$(PYTHON) \
  is $(or $(PYTHON_VERSION),not found): name another, e.g. make $(or $(MAKECMDGOALS),test) PYTHON=python3.12
comma := ,
# One universal lock (uv's `pip compile --universal`, `make lock`) for Linux x86-64 on every
# supported Python, rather than a lock per Python: a pin that differs between Pythons carries
# its environment marker, so the three are one file to read, regenerate and check. It is
# installed as pip's constraints (-c), not as a list (-r): each machine installs only the pins
# its install needs. torch is pinned by its public version, which PyPI serves as the CUDA build
# (its CUDA libraries locked with it, installed only by that build) and which a machine with a
# CPU build of that version (a local wheel folder) satisfies with that one, without them.
LOCK := requirements/lock.txt
# The check that the lock installs from PyPI alone (`make check-lock`, in .ci/run): resolved
# for each supported Python on Linux x86-64 (PyPI's torch: what a GPU machine gets), and the
# GPU recipe for the GPU image's Python.
LOCK_PLATFORM := x86_64-manylinux_2_28
PUBLIC_INDEX := https://pypi.org/simple
# The GPU recipe's lock: what the GPU machine's image (requirements/gpu-image.txt) lacks of what
# servelab imports, and what those need in turn (tests/project/test_gpu_imports.py checks it), at the
# versions of LOCK, carried there as wheels (`make gpu-wheels`). antlr4-python3-runtime
# (omegaconf's parser) has no wheel on PyPI: built here, pure Python.
GPU_LOCK := requirements/gpu.txt
GPU_WHEELS := hydra-core omegaconf plotly narwhals gguf psutil orjson antlr4-python3-runtime \
  fastapi starlette pydantic pydantic-core annotated-types typing-inspection uvicorn \
  opentelemetry-api
RUN_ARGS ?=
GATE ?= conf/gates/headline.yaml
GATE_ARGS ?=
# torch threads for the gate's runs. On the shared 2-core development machine two threads
# stalled each other whenever other jobs ran (decode steps of the embedded model 20x slower and
# erratic); one thread kept the headline gate to minutes. Recorded in the gate's fingerprint.
GATE_THREADS ?= 1
# `make bench BENCH_BASE=0001` fails when any benchmark's minimum time regressed by more than
# BENCH_FAIL against saved run 0001 (`make bench-list` lists the saved runs).
BENCH_BASE ?=
BENCH_FAIL ?= min:25%
BENCH_RUNS ?=

.PHONY: run engines comparison-args test test-latest lock check-lock gpu-lock lint gate claims bench bench-list bench-compare \
  browser clean gpu-wheels

$(STAMP): $(LOCK) pyproject.toml setup.py
	@case " $(SUPPORTED_PYTHONS) " in *" $(PYTHON_VERSION) "*) ;; *) echo "$(REFUSED)"; exit 1;; esac
	$(PY) -c 'import sys; sys.exit("%d.%d" % sys.version_info[:2] != "$(PYTHON_VERSION)")' \
	  2>/dev/null || { rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install --quiet -c $(LOCK) -e '.[test]'
	$(PY) -m pip check
	$(PY) -m servelab.harness.checks.lock $(LOCK)
	touch $(STAMP)

# Regenerate the lock from pyproject.toml's ranges (the newest versions they allow, torch pinned
# by constraints.txt), resolved against PyPI alone, with uv in a throwaway venv.
LOCK_VENV ?= $(or $(TMPDIR),/tmp)/servelab-lock
UV_PUBLIC := --no-config --no-python-downloads --index-url $(PUBLIC_INDEX)
lock:
	rm -rf $(LOCK_VENV) && $(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install --quiet uv
	$(LOCK_VENV)/bin/uv pip compile --quiet $(UV_PUBLIC) --universal \
	  --python-version $(firstword $(SUPPORTED_PYTHONS)) --upgrade --extra test --no-header \
	  -c constraints.txt -o $(LOCK) pyproject.toml
	rm -rf $(LOCK_VENV)
	$(MAKE) --no-print-directory gpu-lock

# The lock resolved from PyPI alone, as a user's machine installs it: a dry resolution (metadata
# only, nothing installed) for each supported Python and for the GPU image; names what fails.
check-lock: $(STAMP)
	$(PY) -m scripts.check_lock --lock $(LOCK) --gpu-lock $(GPU_LOCK) --index $(PUBLIC_INDEX) \
	  --platform $(LOCK_PLATFORM) --pythons $(SUPPORTED_PYTHONS) --gpu-python $(GPU_PYTHON)

# The GPU recipe's lock from LOCK (GPU_WHEELS at LOCK's versions), without upgrading anything.
gpu-lock:
	{ echo "# The GPU recipe's wheels (Makefile GPU_WHEELS) at the versions of $(LOCK): make lock"; \
	  grep -iE '^($(subst $() ,|,$(GPU_WHEELS)))==' $(LOCK); } > $(GPU_LOCK)

# The test suite on the newest versions pyproject.toml allows, in a throwaway venv, so that an
# upstream break shows here before a user meets it. torch stays at constraints.txt's version
# (a newer release here is a CUDA build of several GB). Prints what differs from the lock (a
# local build of a locked version, like torch's CPU build, does not differ).
LATEST_VENV ?= $(or $(TMPDIR),/tmp)/servelab-latest
test-latest:
	rm -rf $(LATEST_VENV) && $(PYTHON) -m venv $(LATEST_VENV)
	$(LATEST_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LATEST_VENV)/bin/python -m pip install --quiet --upgrade -c constraints.txt -e '.[test]'
	$(LATEST_VENV)/bin/python -m pip freeze --exclude-editable | sort > $(LATEST_VENV)/resolved.txt
	@echo "newest versions resolved, where they differ from $(LOCK):"
	@grep -oE '^[A-Za-z0-9_.-]+==[^ ;]+' $(LOCK) | tr A-Z_ a-z- | sort > $(LATEST_VENV)/locked.txt
	@tr A-Z_ a-z- < $(LATEST_VENV)/resolved.txt | sed 's/+[^+]*$$//' | sort \
	  | comm -13 $(LATEST_VENV)/locked.txt - \
	  || true
	touch $(LATEST_VENV)/.servelab-installed-$(PYTHON_VERSION)  # installed: `make test` must not reinstall the lock
	$(MAKE) --no-print-directory test VENV=$(LATEST_VENV)

# The default comparison: each strategy's knee found on this machine (`servelab search`,
# docs/search.md) under one SLO scaled from one request at a time here, within
# RUN_BUDGET_S shared by all (from its start); one KV budget for all, small enough that
# memory decides capacity (32 MiB of fp32 KV: 728 tokens on every machine, the dtype pinned
# because the budget is in bytes); probes skip the spans with nothing in flight
# (replay.skip_idle). Then one report over every probe. RUN_ARGS adds overrides; RUN_SLO is
# the SLO's one source (RUN_SLO=search.slo_from=runs/comparison/DATE/TIME judges against an
# earlier search's SLO instead of scaling one here).
COMPARISON_DIR ?= runs/comparison/$(NOW)
NOW := $(shell date +%Y-%m-%d/%H-%M-%S)
RUN_SLO ?= search.slo_scale.ttft_s=8 search.slo_scale.normalized_latency_s=2
RUN_BUDGET_S ?= 840
COMPARISON := workload=comparison engine.dtype=fp32 engine.kv_budget=32MiB $(RUN_SLO) \
  replay.skip_idle=true
run: $(STAMP)
	@$(VENV)/bin/servelab search $(COMPARISON) search.budget_s=$(RUN_BUDGET_S) \
	  search.out_dir=$(COMPARISON_DIR) $(RUN_ARGS)
	$(VENV)/bin/servelab report $(COMPARISON_DIR) --out $(COMPARISON_DIR)/report.html

# The comparison's overrides but its budget, for the GPU check's short run of the main job
# (scripts/gpu_check.sh; `make gpu-wheels` carries them to the GPU machine as comparison.args).
comparison-args:
	@echo $(COMPARISON)

# `make engines`: the same search over the engines people deploy, each from a cold server under
# the comparison's SLO and KV budget (docs/search.md): servelab's vllm and orca in process and
# vllm over HTTP, vLLM's CPU build as orca and as vllm, llama.cpp at two --parallel values. The
# peers come from scripts/peers/ (install_vllm.sh, `llama_server.sh build`); vLLM loads the
# embedded model exported as a Hugging Face folder (made here once).
PEERS ?= /work/peers
VLLM_PYTHON ?= $(PEERS)/vllm-venv/bin/python
LLAMA_SERVER ?= $(PEERS)/llama.cpp/build/bin/llama-server
HF_MODEL ?= $(PEERS)/smollm2-hf
ENGINES_DIR ?= runs/engines/$(NOW)
ENGINES_BUDGET_S ?= 900
VLLM_CPU := server=vllm server.executable=$(VLLM_PYTHON) server.model=$(HF_MODEL)
LLAMA_CPP := server=llamacpp server.executable=$(LLAMA_SERVER)
ENGINES := 'search.strategies=[vllm,orca,"server=servelab server.strategy=vllm",\
  "$(VLLM_CPU) server.strategy=orca","$(VLLM_CPU) server.strategy=vllm",\
  "$(LLAMA_CPP) server.flags=[--parallel,8]","$(LLAMA_CPP) server.flags=[--parallel,32]"]'
engines: $(STAMP) $(HF_MODEL)/config.json
	@$(VENV)/bin/servelab search $(COMPARISON) search.budget_s=$(ENGINES_BUDGET_S) \
	  search.out_dir=$(ENGINES_DIR) $(ENGINES) $(RUN_ARGS)
	$(VENV)/bin/servelab report $(ENGINES_DIR) --out $(ENGINES_DIR)/report.html

$(HF_MODEL)/config.json:
	HF_HUB_OFFLINE=1 $(PY) scripts/peers/export_hf.py --out $(HF_MODEL)

# The kernel and engine tests again with servelab's dispatch and torch's own kernels lowered to
# AVX2 (SERVELAB_CPU_ISA, ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA), so that a green run on an
# AVX-512 machine stands for an AVX2-only CPU too: torch packs int4 weights and oneDNN takes
# bf16 differently there. Skipped where AVX2 is this CPU's level already (the first pass ran
# exactly that). The kernel tests of the first pass already run every level this CPU runs.
PORTABLE_ISA ?= avx2
PORTABLE_TESTS ?= tests/kernels/test_capabilities.py tests/kernels/test_cpu_builds.py tests/kernels/test_linear_packed.py \
  tests/models/test_fused_decode.py tests/kernels/test_int4_kernels.py tests/strategies/test_int4_weights.py \
  tests/kernels/test_attention_entry.py tests/engine/test_engine_static.py tests/engine/test_engine_iteration.py \
  tests/engine/test_kv_paged_engine.py tests/strategies/test_speculative_engine.py tests/strategies/test_awq.py
# Tests compute on one torch thread each (tests/conftest.py), so they run in one worker per core.
TEST_WORKERS ?= auto
test: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS)
	@if $(PY) -m servelab.kernels.capabilities --above $(PORTABLE_ISA); then \
	  echo "portable pass: the kernel and engine tests at $(PORTABLE_ISA)"; \
	  SERVELAB_CPU_ISA=$(PORTABLE_ISA) ATEN_CPU_CAPABILITY=$(PORTABLE_ISA) ONEDNN_MAX_CPU_ISA=AVX2 \
	    $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) $(PORTABLE_TESTS); \
	else \
	  echo "portable pass skipped: this CPU's level is $(PORTABLE_ISA) or lower, the first pass ran it"; \
	fi

# The headline claims on the embedded model, each a ratio of strategies measured side by side
# (repeated, interleaved); exit status 1 when a claim fails. Writes gate.json and gate.html.
gate: $(STAMP)
	OMP_NUM_THREADS=$(GATE_THREADS) $(VENV)/bin/servelab gate $(GATE) $(GATE_ARGS)

# The five papers' claims beside what this machine measures for them (`servelab claims`), the
# published copy (claims.md, claims.html, claims.json) under reports/published/claims/.
# CLAIMS_ARGS adds arguments, e.g. from=runs/claims/... to re-read an earlier run.
CLAIMS_DIR ?= runs/claims/$(NOW)
claims: $(STAMP)
	OMP_NUM_THREADS=$(GATE_THREADS) $(VENV)/bin/servelab claims out=$(CLAIMS_DIR) $(CLAIMS_ARGS)
	mkdir -p reports/published/claims
	cp $(CLAIMS_DIR)/claims.md $(CLAIMS_DIR)/claims.html $(CLAIMS_DIR)/claims.json reports/published/claims/

# Microbenchmarks of the hot paths (benchmarks/, never collected by `make test`), saved as
# JSON under .benchmarks/ with the commit; with BENCH_BASE, compared against that saved run.
bench: $(STAMP)
	$(PY) -m pytest benchmarks -q -p no:cacheprovider --benchmark-only --benchmark-autosave \
	  --benchmark-columns=min,median,mean,stddev,rounds \
	  $(if $(BENCH_BASE),--benchmark-compare=$(BENCH_BASE) --benchmark-compare-fail=$(BENCH_FAIL))

bench-list: $(STAMP)
	$(VENV)/bin/pytest-benchmark list

# Side by side, e.g. `make bench-compare BENCH_RUNS="0001 0002"` (default: every saved run).
bench-compare: $(STAMP)
	$(VENV)/bin/pytest-benchmark compare $(BENCH_RUNS) --group-by=group,name \
	  --columns=min,median,mean --sort=name

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

# Headless Chromium for the report rendering test (installs a system package as root: never
# part of `make test`; .ci/run calls it); where it cannot, the browser test skips with one line.
browser:
	@command -v chromium >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || echo "chromium not installed: the browser test will be skipped"; }

clean:
	rm -rf $(VENV) runs outputs multirun .benchmarks

# The GPU recipe, into .gpu-wheels/, carried beside the tree to scripts/gpu_check.sh: the wheels
# of $(GPU_LOCK) for the GPU machine's Python ($(GPU_PYTHON), written to python-version: the check
# unpacks them for that Python only), the tokenizer the dummy shapes borrow (tokenizer/), so
# that nothing is downloaded there, and the comparison's overrides (comparison.args). orjson's wheels are tagged manylinux_2_17, which runs on the
# machine's manylinux_2_28.
GPU_PYTHON := 3.12
gpu-wheels: $(STAMP)
	rm -rf .gpu-wheels && mkdir -p .gpu-wheels
	echo $(GPU_PYTHON) > .gpu-wheels/python-version
	$(MAKE) --no-print-directory -s comparison-args > .gpu-wheels/comparison.args
	$(PY) -m scripts.gpu_tokenizer .gpu-wheels/tokenizer
	grep -v '^antlr4-python3-runtime==' $(GPU_LOCK) > .gpu-wheels/binary.txt
	$(PY) -m pip download --quiet --no-deps --only-binary=:all: --python-version $(GPU_PYTHON) \
	  --implementation cp --abi cp312 --platform manylinux_2_28_x86_64 \
	  --platform manylinux_2_17_x86_64 --platform any -d .gpu-wheels -r .gpu-wheels/binary.txt
	$(PY) -m pip wheel --quiet --no-deps -w .gpu-wheels $$(grep '^antlr4-python3-runtime==' $(GPU_LOCK))
	rm .gpu-wheels/binary.txt
	du -sh .gpu-wheels
