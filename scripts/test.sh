#!/usr/bin/env bash
# Set up .venv with everything the test suite needs, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh native serve dev
export HF_HUB_OFFLINE=1
exec .venv/bin/python -m pytest "$@"
