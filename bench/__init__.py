"""`make bench`: how fast the provider makes and removes machines, what it costs while idle, and how much Kubernetes
API and libvirt traffic one machine's life takes, next to the floor: the same libvirt work done by a plain script.

Not part of the product (nothing in `capi_libvirt` imports it) and not part of `make test` (only its N=2 smoke run
is, in the integration tier). `python -m bench --help` lists the knobs; results go to bench/results/.
"""
