"""capi-libvirt: a Cluster API infrastructure provider for plain KVM/libvirt hosts, built on kopf."""

__version__ = "0.1.0"
