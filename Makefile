# Two entry points for a fresh machine: `make run` and `make test`. Each creates .venv when
# missing and installs servelab into it (torch 2.13.0: the CPU build where the machine
# provides it, the CUDA build from PyPI on a GPU machine).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.servelab-installed
RUN_ARGS ?=

.PHONY: run test lint bench browser clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# The default comparison: four strategies x three request rates on the embedded model, one
# KV budget for all (small enough that memory decides capacity); ends with the sweep report.
run: $(STAMP)
	$(VENV)/bin/servelab -m strategy=fastertransformer,orca,orca-chunked,vllm \
	  workload=comparison workload.arrival.rate=1,2,4 engine.kv_budget=32MiB \
	  slo.normalized_latency_s=0.1 slo.ttft_s=2 $(RUN_ARGS)

test: $(STAMP) browser
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q -p no:cacheprovider

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

# Headless Chromium for the report rendering test; skipped quietly where apt is unavailable.
browser:
	@command -v chromium >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || echo "chromium not installed: the browser test will be skipped"; }

clean:
	rm -rf $(VENV) runs outputs multirun
