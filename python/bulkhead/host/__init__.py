"""The ComfyUI (host) process: ``Worker`` (a worker process and the calls
to it, ``workers``), pack loading and proxy nodes (``pack``, ``nodes``),
the memory runtime that joins the workers to ComfyUI's own ledger
(``memory``, ``holder``, ``pager`` at the top level), the control socket
other processes reach it by (``control``), what bulkhead reads of
ComfyUI (``contract``) and the routes on ComfyUI's server (``routes``).
A worker process never imports this package."""
