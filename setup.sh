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
    # constraints.txt pins every dependency to the versions the tests passed with
    # (pip-compile; how to refresh it: its header and README.md).
    echo "== installing ANVE and its pinned dependencies ($1, constraints.txt)"
    .venv/bin/python -m pip install --quiet --upgrade pip --constraint constraints.txt
    .venv/bin/python -m pip install --quiet --constraint constraints.txt -e "$1"
}

ensure_debs() {
    # ensure_debs WHAT COMMAND:PACKAGE...: install the Debian packages whose command is
    # missing (see install_debs).
    local what="$1" missing=() pair
    shift
    for pair in "$@"; do
        command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
    done
    install_debs "$what" "${missing[@]}"
}

install_debs() {
    # install_debs WHAT PACKAGE...: install these Debian packages, only as root (otherwise
    # say what to install; the caller goes on without).
    local what="$1" missing=("${@:2}")
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

llama_cpp_wheel() {
    # llama-cpp-python (the foreign-engine tests and the benchmark's comparison) compiles
    # llama.cpp for this very CPU (-march=native): a wheel built on another processor can
    # crash here, so it is built once per CPU (keyed by its flags) into ANVE's cache, not
    # taken from pip's wheel cache. llama.cpp 0.3.36's AMX path faults on Sapphire Rapids
    # (a general protection fault in ldtilecfg), so AMX stays off in this build.
    local key dir flags=""
    key="$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | sha256sum | cut -c1-16)"
    dir="${XDG_CACHE_HOME:-$HOME/.cache}/anve/llama-cpp-wheels/$key"
    if ! ls "$dir"/llama_cpp_python-*.whl >/dev/null 2>&1; then
        if echo 'int main(){}' | c++ -mno-amx-tile -mno-amx-int8 -mno-amx-bf16 -x c++ \
            -o /dev/null - >/dev/null 2>&1; then
            flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        fi
        echo "== compiling llama.cpp for this CPU (llama-cpp-python; about 12 minutes on 2 cores, once)"
        CMAKE_ARGS="-DGGML_NATIVE=ON" CFLAGS="$flags" CXXFLAGS="$flags" \
            .venv/bin/python -m pip wheel --quiet --no-deps --no-cache-dir \
            --constraint constraints.txt --wheel-dir "$dir" llama-cpp-python
    fi
    .venv/bin/python -m pip install --quiet --no-deps --force-reinstall \
        "$dir"/llama_cpp_python-*.whl
}

build_kernels() {
    # Our int4/int8 kernels are compiled once with the system C++ compiler (a few
    # seconds); without one the engine runs torch's kernels, about 2x slower.
    ensure_debs "a C++ compiler for ANVE's fast CPU kernels" c++:g++
    .venv/bin/python -m engine.cpu.kernels || true
}

ensure_window_libraries() {
    # The X11 libraries Qt's xcb plugin needs that this system lacks (app/display.py
    # asks ldd); without them the window cannot open.
    local debs
    debs="$(.venv/bin/python -m app.display)"
    # shellcheck disable=SC2086  # one word per package
    install_debs "the X11 libraries the window needs" $debs
}

case "$mode" in
    run)
        ensure_venv "."
        ensure_window_libraries
        build_kernels
        echo "== installing the default models (Qwen2.5-Coder 1.5B + 0.5B, verified by SHA-256)"
        .venv/bin/python -m engine.models install appliance
        .venv/bin/python -m engine.models prepare appliance
        exec .venv/bin/anve "$@"
        ;;
    test)
        echo "== the test set-up includes llama-cpp-python[server] (a real llama.cpp server for" \
            "the foreign-engine tests): it compiles llama.cpp once per processor (about 12" \
            "minutes on 2 cores) into ~/.cache/anve/llama-cpp-wheels"
        ensure_debs "the installer test's checkers; a compiler for llama-cpp-python" \
            desktop-file-validate:desktop-file-utils systemd-analyze:systemd \
            shellcheck:shellcheck c++:g++
        ensure_venv "."
        llama_cpp_wheel
        ensure_venv ".[dev,foreign]"
        build_kernels
        echo "== installing the light model used by the tests"
        .venv/bin/python -m engine.models install light
        echo "== checking the import contracts (pyproject.toml's [tool.importlinter])"
        .venv/bin/lint-imports --no-cache --no-logo
        exec .venv/bin/python -m pytest -m "not slow and not perf" "$@"
        ;;
    *)
        echo "usage: bash setup.sh run|test [options]" >&2
        exit 2
        ;;
esac
