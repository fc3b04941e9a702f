"""The one place that talks to libvirt: connections per host, error translation, and machine operations.

libvirt's client library writes warnings of its own to stderr (a host's certificate it refuses, say), beside the
operator's log lines, so a JSON log would no longer be one JSON object a line. The same facts reach the operator as
errors, translated in hypervisor.errors and named in conditions and logs, so libvirt's own log output goes nowhere:
libvirt reads LIBVIRT_LOG_OUTPUTS once, when it is first imported, which is here, before any module of this package
uses it. The variable is set for that import only, so no process the operator starts inherits it, and an admin who
wants libvirt's log sets it in the manager's environment, where it is kept.
"""

import os

if "LIBVIRT_LOG_OUTPUTS" in os.environ:
    import libvirt  # noqa: F401  (initialised with the admin's log outputs)
else:
    os.environ["LIBVIRT_LOG_OUTPUTS"] = "4:file:/dev/null"
    try:
        import libvirt  # noqa: F401  (initialised now, with no log output)
    finally:
        del os.environ["LIBVIRT_LOG_OUTPUTS"]
