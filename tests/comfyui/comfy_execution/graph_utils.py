"""`ExecutionBlocker` and `GraphBuilder` of upstream's
comfy_execution.graph_utils (tests only).  A blocker is a value that stops
the nodes it reaches (their outputs are the blocker too).  A GraphBuilder
makes the graph a node's `expand` returns, its node ids under a prefix:
by default "<root>.<call index>.<graph index>.", where the executor sets
root and call index (the node's id, which call of it) before each call of
a node, and each builder made during that call takes the next graph index.
Written for bulkhead; no upstream code."""


def is_link(value):
    """Whether value is a link, [node id, output index]."""
    return (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
            and isinstance(value[1], (int, float)))


class ExecutionBlocker:
    def __init__(self, message):
        self.message = message


class GraphBuilder:
    _default_prefix_root = ""
    _default_prefix_call_index = 0
    _default_prefix_graph_index = 0

    def __init__(self, prefix=None):
        self.prefix = GraphBuilder.alloc_prefix() if prefix is None else prefix
        self.nodes = {}
        self.id_gen = 1

    @classmethod
    def set_default_prefix(cls, prefix_root, call_index, graph_index=0):
        cls._default_prefix_root = prefix_root
        cls._default_prefix_call_index = call_index
        cls._default_prefix_graph_index = graph_index

    @classmethod
    def alloc_prefix(cls, root=None, call_index=None, graph_index=None):
        """The next default prefix (the graph index moves on by one)."""
        root = GraphBuilder._default_prefix_root if root is None else root
        call_index = GraphBuilder._default_prefix_call_index if call_index is None else call_index
        graph_index = GraphBuilder._default_prefix_graph_index if graph_index is None else graph_index
        GraphBuilder._default_prefix_graph_index += 1
        return f"{root}.{call_index}.{graph_index}."

    def node(self, class_type, id=None, **inputs):
        if id is None:
            id = str(self.id_gen)
            self.id_gen += 1
        full = self.prefix + id
        if full not in self.nodes:
            self.nodes[full] = Node(full, class_type, inputs)
        return self.nodes[full]

    def lookup_node(self, id):
        return self.nodes.get(self.prefix + id)

    def finalize(self):
        return {node_id: node.serialize() for node_id, node in self.nodes.items()}


class Node:
    def __init__(self, id, class_type, inputs):
        self.id = id
        self.class_type = class_type
        self.inputs = inputs
        self.override_display_id = None

    def out(self, index):
        return [self.id, index]

    def set_input(self, key, value):
        if value is None:
            self.inputs.pop(key, None)
        else:
            self.inputs[key] = value

    def get_input(self, key):
        return self.inputs.get(key)

    def set_override_display_id(self, override_display_id):
        self.override_display_id = override_display_id

    def serialize(self):
        out = {"class_type": self.class_type, "inputs": self.inputs}
        if self.override_display_id is not None:
            out["override_display_id"] = self.override_display_id
        return out
