"""`python -m capi_libvirt`: the same as the `capi-libvirt` command."""

import sys

from capi_libvirt.cli import main

sys.exit(main())
