"""The one place that talks to libvirt: connections per host, error translation, and machine operations.

libvirt's client library writes warnings of its own to stderr (a host's certificate it refuses, say), beside the
operator's log lines, so a JSON log would no longer be one JSON object a line. The same facts reach the operator as
errors, translated in hypervisor.errors and named in conditions and logs, so libvirt's own log output goes nowhere,
set here before any module of this package loads libvirt (which reads it once). An admin who wants it sets libvirt's
LIBVIRT_LOG_OUTPUTS, which is kept.
"""

import os

os.environ.setdefault("LIBVIRT_LOG_OUTPUTS", "4:file:/dev/null")
