"""The local development environment: a real kube-apiserver and real libvirt hosts started on this machine.

It backs the test bed (tests/ fixtures), `make bench`, `make run` and `make demo` (`python -m devenv`). It is not
part of the product: the `capi_libvirt` package never imports it, and the operator's wheel and image don't ship it.
"""
