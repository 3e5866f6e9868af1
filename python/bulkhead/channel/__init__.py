"""What crosses the channel between a host and its workers, used by both
processes: the peer (calls, callbacks, handles, errors: ``peer``), arrays
and tensors (``tensors``) and the private host <-> worker formats
(``formats``).  Nothing here imports host or worker code."""
