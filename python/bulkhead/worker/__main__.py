"""``<python> -m bulkhead.worker``: the worker process's entry point.

The process's state lives in the package (``bulkhead.worker``), not in
this ``__main__`` module, so ``from bulkhead.worker import call_host`` in
pack code sees this process's channel.
"""

import sys

from bulkhead.worker import main

sys.exit(main())
