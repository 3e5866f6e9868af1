"""`ExecutionBlocker` of upstream's comfy_execution.graph_utils (tests
only): a value that stops the nodes it reaches (their outputs are the
blocker too).  Written for bulkhead; no upstream code."""


class ExecutionBlocker:
    def __init__(self, message):
        self.message = message
