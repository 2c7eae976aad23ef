"""The ``onward`` command line.

A gevent worker (``onward worker -P gevent``) needs the standard library patched before
psycopg, redis or kombu are imported, so that happens here, before anything else."""

from workers.greenpatch import patch_for_green_pool

patch_for_green_pool()

__all__: list[str] = []
