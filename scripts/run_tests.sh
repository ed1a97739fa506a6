#!/usr/bin/env bash
# The test command: set up the venv, build, run the test suite. GPU tests are marked `gpu` and
# skip themselves without CUDA. Extra arguments go to pytest.
source "$(dirname "$0")/env.sh"
python -m pip install -q --no-build-isolation --no-deps -e .
python -m pytest tests -q "$@"
