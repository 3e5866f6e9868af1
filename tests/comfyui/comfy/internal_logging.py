"""The DETAIL log level (between DEBUG and INFO) the memory manager logs at."""

import logging

DETAIL = 15
logging.addLevelName(DETAIL, "DETAIL")

_log = logging.getLogger()


def detail(msg, *args, **kwargs):
    if _log.isEnabledFor(DETAIL):
        _log.log(DETAIL, msg, *args, **kwargs)
