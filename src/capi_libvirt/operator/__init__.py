"""The operator: kopf handlers (a thin layer) and how the operator process is started."""
