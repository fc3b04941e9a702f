"""The one place that talks to libvirt: connections per host, error translation, and machine operations."""
