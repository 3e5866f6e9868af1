"""`DynamicPrompt` of upstream's comfy_execution.graph (tests only): the
prompt as executed, with the nodes an expansion added ("ephemeral").
A V3 node asking for Hidden.dynprompt gets one, and a V1 node a hidden
DYNPROMPT input.  ExecutionBlocker is here too, as upstream re-exports it
from graph_utils.  Written for bulkhead; no upstream code."""

from comfy_execution.graph_utils import ExecutionBlocker  # noqa: F401  (packs import it from here)


class DynamicPrompt:
    def __init__(self, original_prompt):
        self.original_prompt = original_prompt
        self.ephemeral_prompt = {}
        self.ephemeral_parents = {}

    def get_node(self, node_id):
        if node_id in self.ephemeral_prompt:
            return self.ephemeral_prompt[node_id]
        if node_id in self.original_prompt:
            return self.original_prompt[node_id]
        raise KeyError(node_id)

    def has_node(self, node_id):
        return node_id in self.original_prompt or node_id in self.ephemeral_prompt

    def add_ephemeral_node(self, node_id, node_info, parent_id):
        self.ephemeral_prompt[node_id] = node_info
        self.ephemeral_parents[node_id] = parent_id

    def get_parent_node_id(self, node_id):
        return self.ephemeral_parents.get(node_id)

    def all_node_ids(self):
        return set(self.original_prompt) | set(self.ephemeral_prompt)

    def get_original_prompt(self):
        return self.original_prompt
