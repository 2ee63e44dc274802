# Two commands (see README.md):  make demo   and   make test
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test setup system-deps

# System packages the renderer and tests need (headless EGL for the physics world's rasterizer,
# ffmpeg-free: PyAV wheels carry their own codecs). Skipped when already present or not root.
system-deps:
	@sh .ci/system-deps.sh

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[test]"
	touch $(STAMP)

setup: system-deps $(STAMP)

demo: setup
	$(BIN)/alaya-flash demo --out out/demo.mp4 --overwrite

test: setup
	$(BIN)/python -m pytest
