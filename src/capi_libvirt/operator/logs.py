"""The operator's log output: JSON lines (one object per record) in the container, plain text at a terminal.

Both go through kopf's formatters (kopf.configure), so kopf's per-object records carry the object: as an "object"
field in JSON, as a `[namespace/name]` prefix in plain text. JSON records also name their logger. What is logged is
the same in both formats: messages never hold Secret data (bootstrap data, host keys), and the only extra fields
are the logger's name, kopf's object reference, and the fields of the reconcile the line belongs to (`fields`: a
machine pass's machine, cluster, host and reconcile ID), as JSON fields or as `key=value` after the message.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator

from capi_libvirt.kube import kubeconfig

JSON, PLAIN = "json", "plain"
FORMATS = (JSON, PLAIN)
PLAIN_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def default_format() -> str:
    """JSON in a pod (Kubernetes sets KUBERNETES_SERVICE_HOST there), plain text elsewhere."""
    return JSON if kubeconfig.in_a_pod() else PLAIN


# The fields of the reconcile running in this task (asyncio copies the context into the tasks a pass starts).
FIELDS: contextvars.ContextVar[tuple[tuple[str, str], ...]] = contextvars.ContextVar("capi_libvirt_log_fields",
                                                                                     default=())


@contextlib.contextmanager
def fields(**values: str | None) -> Iterator[None]:
    """Every record logged inside carries these fields (empty ones are left out)."""
    merged = {**dict(FIELDS.get()), **{key: value for key, value in values.items() if value}}
    token = FIELDS.set(tuple(merged.items()))
    try:
        yield
    finally:
        FIELDS.reset(token)


class _Fields(logging.Filter):
    """The reconcile's fields: attributes of the record (JSON fields), or `key=value` after the message (text)."""

    def __init__(self, inline: bool) -> None:
        super().__init__()
        self.inline = inline

    def filter(self, record: logging.LogRecord) -> bool:
        current = FIELDS.get()
        if current and self.inline:
            suffix = " ".join(f"{key}={value}" for key, value in current)
            record.msg = f"{record.msg} [{suffix.replace('%', '%%') if record.args else suffix}]"
        elif current:
            for key, value in current:
                setattr(record, key, value)
        return True


class _LoggerName(logging.Filter):
    """Adds the logger's name as a field of JSON records (kopf's JSON formatter leaves it out)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.logger = record.name
        return True


def configure(log_format: str, verbose: bool = False) -> None:
    """Replace the root logger's handlers with one writing `log_format` to stderr."""
    import kopf  # here, not at the top: the command line builds its parser without loading kopf
    if log_format not in FORMATS:
        raise ValueError(f"log format {log_format!r}: expected one of {', '.join(FORMATS)}")
    root = logging.getLogger()
    for handler in list(root.handlers):  # logging.basicConfig's, from the command line's start
        root.removeHandler(handler)
    if log_format == JSON:
        kopf.configure(verbose=verbose, log_format=kopf.LogFormat.JSON, log_prefix=False)
        for handler in root.handlers:
            handler.addFilter(_LoggerName())
            handler.addFilter(_Fields(inline=False))
    else:
        # A format string: kopf takes one (its make_formatter's `case str()`); the annotation names only LogFormat.
        kopf.configure(verbose=verbose, log_format=PLAIN_FORMAT, log_prefix=True)  # type: ignore[arg-type]
        for handler in root.handlers:
            handler.addFilter(_Fields(inline=True))
    if not verbose:
        # kopf's per-object INFO lines: one "Handler ... succeeded" for every watch event of every machine, noise
        # (and CPU) at a few hundred machines; its warnings and errors stay, and -v brings the rest back.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
