#!/usr/bin/env bash
# The unit tier on the other supported Pythons (3.12, 3.13) beside the main venv's 3.11, and the part of the
# integration tier that boots no guest: the product against a real kube-apiserver and a real libvirtd on that Python
# (libvirt-python built for it, kubernetes_asyncio, admission, the request timeout, image downloads over TLS and a
# proxy, the domain XML against libvirt's schema). A venv of each from pyenv's builds, installed from the same hashed
# lock. A missing interpreter fails (CI must not skip). The integration modules that boot guests or run the manager
# for minutes stay on 3.11: on 2 cores, CI's time does not stretch to running them three times.
set -euo pipefail
INTEGRATION=(tests/integration/test_libvirt_host.py tests/integration/test_kube_request_timeout.py
             tests/integration/test_crd_admission.py tests/integration/test_domain_xml_schema.py
             tests/integration/test_template_capacity_reconcile.py tests/integration/test_image_downloads.py
             tests/integration/test_endpoint_holder.py)
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
  if CAPI_LIBVIRT_TIMING_DIR="out/timing-python$version" "$venv/bin/pytest" -q -p no:cacheprovider \
      -m "unit or integration" tests/unit "${INTEGRATION[@]}" \
      > "out/logs/unit-python$version.log" 2>&1; then outcome=passed; else outcome=FAILED; status=1; fi
  echo "[other-pythons] unit tier and ${#INTEGRATION[@]} integration modules on $("$venv/bin/python" --version): $outcome:" \
    "$(grep -E '(passed|failed).* in [0-9.]+s' "out/logs/unit-python$version.log" | tail -1)"
done
exit $status
