"""Demo pack (numpy 2.x).  The one line a pack needs to run isolated."""
import bulkhead

NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = bulkhead.comfy_pack(__file__)
