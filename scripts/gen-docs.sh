#!/usr/bin/env bash
# Regenerate docs/declarations.md from the rule registry (tests/test_docs.py checks it).
set -euo pipefail
cd "$(dirname "$0")/.."
{ cat docs/declarations.head.md; .venv/bin/rsi rules --markdown; } > docs/declarations.md
