#!/usr/bin/env bash
# One-step set-up for ANVE on a fresh machine, then run something.
#   bash setup.sh run [anve options]   set up, fetch the default models, open the desktop app
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

ensure_debs() {
    # ensure_debs WHAT COMMAND:PACKAGE...: install the Debian packages whose command is
    # missing, only as root (otherwise say what to install; the caller goes on without).
    local what="$1" missing=() pair
    shift
    for pair in "$@"; do
        command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
    done
    if [ ${#missing[@]} -eq 0 ]; then
        return
    fi
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "== installing ${missing[*]} ($what)"
        local apt=(apt-get install -y -qq --no-install-recommends "${missing[@]}")
        if ! DEBIAN_FRONTEND=noninteractive "${apt[@]}" >/dev/null 2>&1; then
            apt-get update -qq >/dev/null 2>&1 || true
            DEBIAN_FRONTEND=noninteractive "${apt[@]}" >/dev/null ||
                echo "warning: could not install ${missing[*]} ($what)"
        fi
    else
        echo "note: $what: sudo apt-get install ${missing[*]}"
    fi
}

build_kernels() {
    # Our int4/int8 kernels are compiled once with the system C++ compiler (a few
    # seconds); without one the engine runs torch's kernels, about 2x slower.
    ensure_debs "a C++ compiler for ANVE's fast CPU kernels" c++:g++
    .venv/bin/python -m engine.kernels || true
}

case "$mode" in
    run)
        ensure_venv "."
        build_kernels
        echo "== installing the default models (Qwen2.5-Coder 1.5B + 0.5B, verified by SHA-256)"
        .venv/bin/python -m engine.models install appliance
        .venv/bin/python -m engine.models prepare appliance
        exec .venv/bin/anve "$@"
        ;;
    test)
        echo "== the test set-up includes llama-cpp-python[server] (a real llama.cpp server for" \
            "the foreign-engine tests): its first install compiles llama.cpp (about 12 minutes" \
            "on 2 cores); pip's wheel cache keeps the build"
        ensure_debs "the installer test's checkers; a compiler for llama-cpp-python" \
            desktop-file-validate:desktop-file-utils systemd-analyze:systemd \
            shellcheck:shellcheck c++:g++
        ensure_venv ".[dev,foreign]"
        build_kernels
        echo "== installing the light model used by the tests"
        .venv/bin/python -m engine.models install light
        exec .venv/bin/python -m pytest -m "not slow and not perf" "$@"
        ;;
    *)
        echo "usage: bash setup.sh run|test [options]" >&2
        exit 2
        ;;
esac
