"""What crosses the channel between a host and its workers, used by both
processes: the peer (calls, callbacks, handles, errors: ``peer``), arrays
and tensors (``tensors``), the private host <-> worker formats
(``formats``) and the names each side calls in the other (``targets``).  Nothing here imports host or worker code."""
