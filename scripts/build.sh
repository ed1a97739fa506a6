#!/usr/bin/env bash
# Builds flash_cuda in place (flash_cuda/_C.abi3.so) into the project venv.
# FLASH_CUDA_ARCHS / FLASH_CUDA_HEADDIMS / MAX_JOBS choose what is compiled (see README).
source "$(dirname "$0")/env.sh"
python -m pip install -q --no-build-isolation --no-deps -e .
