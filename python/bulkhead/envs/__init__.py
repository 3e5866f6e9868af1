"""Pack configs (``config``: comfy-env.toml, read and checked) and the
environments built for them (``build``: install, status, stamps).  Used by
the host, the ``bulkhead`` command and a pack's install.py; never by a
worker."""
