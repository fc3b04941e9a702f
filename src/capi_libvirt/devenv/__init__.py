"""The local development environment: a real kube-apiserver and real libvirt hosts started on this machine.

It backs the test bed (tests/ fixtures) and `make run` when no cluster is reachable. Nothing here is used by the
operator when it runs against a real management cluster.
"""
