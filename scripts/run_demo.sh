#!/usr/bin/env bash
# The main job: set up the venv, build, and run the demo (flash_cuda vs standard attention:
# error, time and peak memory side by side; the CPU path when there is no GPU).
source "$(dirname "$0")/env.sh"
python -m pip install -q --no-build-isolation --no-deps -e .
python examples/demo.py "$@"
