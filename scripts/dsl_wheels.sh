#!/usr/bin/env bash
# The CuTe DSL and TileLang wheels for a GPU machine without network, in parts that each fit one `device` call's
# carry (64 MiB with the working tree): .dev/a, .dev/b, .dev/b2, .dev/c (git ignores .dev/). On the GPU machine,
# in one warm session (it goes back after 30 s idle), copy each part to one folder, call after call, then:
#   cat cu13.part.* > nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
#   cat tl.part.* > tilelang-0.1.15-cp39-abi3-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
#   pip install --no-deps --no-index nvidia_cutlass_dsl*.whl z3_solver-*.whl apache_tvm_ffi-*.whl \
#       torch_c_dlpack_ext-*.whl tilelang-*.whl
# (--no-deps: nvidia-cutlass-dsl names the cu12 libraries unconditionally; the machine's torch 2.11 + cu130 already
# has cuda-bindings 13, cuda-pathfinder, numpy, psutil, tqdm, protobuf, ml_dtypes, cloudpickle.) docs/backends.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PIP=${PIP:-.venv/bin/pip}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
$PIP download -q -d "$TMP" --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 \
    nvidia-cutlass-dsl-libs-cu13==4.8.1 tilelang==0.1.15 "apache-tvm-ffi==0.1.12" "z3-solver==4.15.4.0" \
    torch-c-dlpack-ext==0.1.5
rm -rf .dev && mkdir -p .dev/a .dev/b .dev/b2 .dev/c
split -b 50000000 "$TMP"/nvidia_cutlass_dsl_libs_cu13-*.whl .dev/cu13.part.
mv .dev/cu13.part.aa .dev/a/ && mv .dev/cu13.part.ab .dev/b/
mv "$TMP"/nvidia_cutlass_dsl-4.8.1-*.whl "$TMP"/nvidia_cutlass_dsl_libs_base-*.whl "$TMP"/nvidia_cutlass_dsl_libs_core-*.whl .dev/a/
split -b 23000000 "$TMP"/tilelang-*.whl .dev/tl.part.
mv .dev/tl.part.aa .dev/b2/ && mv .dev/tl.part.ab .dev/tl.part.ac .dev/c/
mv "$TMP"/z3_solver-*.whl "$TMP"/apache_tvm_ffi-*.whl "$TMP"/torch_c_dlpack_ext-*.whl .dev/c/
du -sh .dev/*
