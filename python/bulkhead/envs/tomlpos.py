"""Where a key is defined in TOML source text, for errors that name a
file and line: ``find_line(text, *path)`` scans for the ``[table]`` header
or ``key =`` line of a parsed document's key path (TOML parsers give no
positions for a value, only for a syntax error).  Used by envs/config.py
and envs/rootconfig.py.
"""

import re


def _unquote(k):
    k = k.strip()
    if len(k) >= 2 and k[0] == k[-1] and k[0] in "\"'":
        return k[1:-1]
    return k


def _split_dotted(key):
    # Dotted keys, quoted parts kept whole.
    parts = re.findall(r'"[^"]*"|\'[^\']*\'|[^.]+', key)
    return [_unquote(p) for p in parts if p.strip()]


_HEADER = re.compile(r"\s*\[\[?\s*(.+?)\s*\]\]?\s*(?:#.*)?\Z")
_KEYPART = r"""(?:"[^"]*"|'[^']*'|[A-Za-z0-9_-]+)"""
_KEYLINE = re.compile(r"\s*(%s(?:\s*\.\s*%s)*)\s*=" % (_KEYPART, _KEYPART))


def find_line(text, *path):
    """The 1-based line that defines ``path`` (table names, then a key),
    by scanning the source: a ``[table]`` header, a ``key =`` line under
    the right header, or a dotted key.  None when not found."""
    want = list(path)
    table = []
    partial = None      # a line defining a prefix of path (an inline table)
    for i, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        m = _HEADER.match(s)
        if m and s.startswith("["):
            table = _split_dotted(m.group(1))
            if table[:len(want)] == want:      # the table, or its first sub-table
                return i
            continue
        m = _KEYLINE.match(s)
        if m:
            full = table + _split_dotted(m.group(1))
            if full[:len(want)] == want:
                return i
            if partial is None and len(full) < len(want) and want[:len(full)] == full:
                partial = i
    return partial
