#!/usr/bin/env bash
# The unit tier on the other supported Pythons (3.12, 3.13) beside the main venv's 3.11: a venv of each from pyenv's
# builds, installed from the same hashed lock, then `pytest -m unit`. A missing interpreter fails (CI must not skip).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p out/logs
status=0
for version in ${CAPI_LIBVIRT_OTHER_PYTHONS:-3.12 3.13}; do
  if command -v pyenv >/dev/null && found=$(pyenv latest "$version" 2>/dev/null); then
    python="$(pyenv root)/versions/$found/bin/python$version"
  else
    python="$(command -v "python$version" || true)"
  fi
  if [[ -z "$python" || ! -x "$python" ]]; then
    echo "python$version: not found (pyenv install $version, or put python$version on PATH)" >&2
    exit 1
  fi
  venv=".venv-$version"
  if [[ ! -f "$venv/.installed" || requirements-dev.lock -nt "$venv/.installed" || pyproject.toml -nt "$venv/.installed" ]]; then
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check --require-hashes -r requirements-dev.lock
    "$venv/bin/pip" install -q --disable-pip-version-check --no-deps -e .
    touch "$venv/.installed"
  fi
  # Its own timing folder: the main run's timing report is not this one's.
  if CAPI_LIBVIRT_TIMING_DIR="out/timing-python$version" "$venv/bin/pytest" -q -p no:cacheprovider -m unit tests \
      > "out/logs/unit-python$version.log" 2>&1; then outcome=passed; else outcome=FAILED; status=1; fi
  echo "[other-pythons] unit tier on $("$venv/bin/python" --version): $outcome:" \
    "$(grep -E '(passed|failed)( |,).* in ' "out/logs/unit-python$version.log" | tail -1)"
done
exit $status
