"""ComfyUI runs every custom node's prestartup_script.py before it loads any
pack.  bulkhead's routes ``import comfy_env`` to bulkhead
(bulkhead.host.comfy_env.route), so the packs written for comfy-env --
``from comfy_env import register_nodes`` in their __init__.py -- run their
isolated nodes in bulkhead workers, even with the real comfy-env installed
beside it (their requirements.txt pins it).  Each such pack logs one line
saying bulkhead serves it.  BULKHEAD_COMFY_ENV=off hands them all back to
the real comfy-env package."""


def _route():
    import logging
    try:
        from bulkhead.host import comfy_env
    except ImportError as e:
        logging.getLogger("bulkhead").warning(
            "bulkhead: prestartup: bulkhead cannot be imported (%s); packs written for comfy-env "
            "run under the comfy-env package", e)
        return
    try:
        comfy_env.route()
    except Exception as e:  # ComfyUI must start
        logging.getLogger("bulkhead").warning("bulkhead: prestartup: comfy_env not routed to bulkhead: %s", e)


_route()
