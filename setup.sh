#!/usr/bin/env bash
# One-step set-up for ANVE on a fresh machine, then run something.
#   bash setup.sh run [chat options]   set up, fetch the default models, start the chat
#   bash setup.sh test [pytest args]   set up (light model only) and run the test suite
# Safe to run again: it reuses .venv and the converted model cache.
set -euo pipefail
cd "$(dirname "$0")"
mode="${1:-}"
shift || true

export HF_HUB_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

pick_python() {
    for py in python3.11 python3; do
        if command -v "$py" >/dev/null 2>&1 &&
            "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
            echo "$py"
            return
        fi
    done
    echo "error: ANVE needs Python 3.11 (python3.11 or python3 of that version)" >&2
    exit 1
}

ensure_venv() {
    if [ ! -x .venv/bin/python ]; then
        echo "== creating the virtual environment in .venv"
        "$(pick_python)" -m venv .venv
    fi
    echo "== installing ANVE and its pinned dependencies ($1)"
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e "$1"
}

case "$mode" in
    run)
        ensure_venv "."
        echo "== installing the default models (Qwen2.5-Coder 1.5B + 0.5B, verified by SHA-256)"
        .venv/bin/python -m engine.models install appliance
        .venv/bin/python -m engine.models prepare appliance
        exec .venv/bin/python -m engine.chat "$@"
        ;;
    test)
        ensure_venv ".[dev]"
        echo "== installing the light model used by the tests"
        .venv/bin/python -m engine.models install light
        exec .venv/bin/python -m pytest -m "not slow" "$@"
        ;;
    *)
        echo "usage: bash setup.sh run|test [options]" >&2
        exit 2
        ;;
esac
