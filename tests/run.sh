#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what the tests need, then runs them all.
#   - Python deps (the package with its dev extra)
#   - redis-server and chromium (Debian packages) for the cluster and status-page tests
#   - llama-server, built once from the pinned llama-cpp-python sdist and cached outside the
#     repo (~/.cache/prefix-proxy), for the real-engine tests
# Extra arguments go to pytest (e.g. `bash tests/run.sh -k routing`).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
"$PY" -m pip install --quiet --disable-pip-version-check -e '.[dev,engines,charts]'

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing ${missing[*]} (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "missing: ${missing[*]} (Debian: apt-get install ${missing[*]})" >&2
    exit 1
  fi
fi

"$PY" -m loadtests.engines.llamacpp build

set +e
"$PY" -m pytest -q -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "pytest collected no tests: failing the run" >&2
  exit 1
fi
exit "$rc"
