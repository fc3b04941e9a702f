"""How a reconcile's phase says it cannot go on yet: `Wait`, with the condition's reason and message and when to look
again. The lowest floor of the reconciles: the image imports raise it as the machine's phases do."""

from __future__ import annotations

RECHECK_WAITING = 30.0


class Wait(Exception):
    """A phase cannot go on: `reason`/`message` go into the Provisioned condition; retry after `retry_after` s (None:
    only when a watch wakes it). `failure`: a failure, retried with backoff, rather than a wait for something due."""

    def __init__(self, reason: str, message: str, retry_after: float | None = RECHECK_WAITING, *,
                 failure: bool = False) -> None:
        super().__init__(message)
        self.reason, self.message, self.retry_after, self.failure = reason, message, retry_after, failure
