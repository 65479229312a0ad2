#!/usr/bin/env bash
# `PYTHON -m pip install ARGS…`, tried again after a growing pause when it fails: the wheels kart
# needs are large (PyTorch's CUDA libraries), a dropped connection resumes, and pip keeps the wheels
# it finished in its cache, so a network outage of a few minutes costs minutes, not the run. pip
# itself is upgraded first: a new virtualenv's pip predates --resume-retries.
#
#   scripts/pip-install.sh PYTHON ARGS…
set -euo pipefail
python="$1"; shift
attempts=6
for attempt in $(seq "$attempts"); do
  "$python" -m pip install --quiet --retries 10 --timeout 60 --upgrade pip \
    && "$python" -m pip install --quiet --retries 10 --timeout 60 --resume-retries 20 "$@" && exit 0
  [ "$attempt" -lt "$attempts" ] || { echo "pip-install: pip install $* failed $attempts times" >&2; exit 1; }
  pause=$(( 15 * 2 ** (attempt - 1) ))
  echo "pip-install: pip install failed (attempt $attempt of $attempts); trying again in ${pause}s" >&2
  sleep "$pause"
done
