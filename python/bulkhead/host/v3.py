"""V3 nodes in the host: the real node's schema, rebuilt in the host's
comfy_api, and the hidden values a call sends.

A V3 node's proxy (host/runtime.py ``PackRuntime._proxy_v3``) answers
define_schema with the io.Schema the worker captured, made of the host's
own io classes (channel/nodes.py ``decode_schema``).  ``hidden_values``
is the hidden values ComfyUI set on the class clone, as a call sends them
to the worker (channel/nodes.py ``encode_hidden``).
"""

from ..channel.nodes import encode_hidden


def hidden_values(clone):
    from comfy_api.latest import io  # comfyui: comfy_api
    return encode_hidden(clone, io)
