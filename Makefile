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

# Blender as a Python module (bpy) for tests/test_blender_addon.py, in a venv of its own: bpy 5.0.1
# pins numpy<2 and Python 3.11 (the project's venv has numpy 2). ~375 MB download, ~1 GB installed.
# Without python3.11 the test is skipped, and says so.
BPY_VENV := .venv-bpy
$(BPY_VENV)/.installed: Makefile
	@if command -v python3.11 >/dev/null; then \
		python3.11 -m venv $(BPY_VENV) && $(BPY_VENV)/bin/pip install --quiet "bpy==5.0.1" && touch $@; \
	else echo "no python3.11: bpy==5.0.1 needs it; tests/test_blender_addon.py will be skipped"; fi

setup: system-deps $(STAMP)

demo: setup
	$(BIN)/alaya-flash demo --out out/demo.mp4 --overwrite

# The test files spread over the cores (pytest-xdist; tests/README.md): `-m "not slow"` for the fast part.
# Bytecode is written whatever the caller's environment says: without it every process the tests start
# compiles the package from source again (about 60 s of CPU a run, tests/README.md).
test: setup $(BPY_VENV)/.installed
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -n auto
