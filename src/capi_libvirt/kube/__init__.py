"""The one place that talks to the Kubernetes API for the operator's own calls (kopf handles watches and events)."""
