"""One idempotent reconcile per kind, each an ordered chain of phases; kopf handlers call these."""
