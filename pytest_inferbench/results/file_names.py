"""File names the plugin makes from what it is given (recipe fields, test names, parametrize ids,
server node names): bounded in length, so that any file system takes them.

A file name may hold at most 255 bytes (`NAME_MAX` on Linux and macOS file systems); a longer
one fails its write with `File name too long`. A point's name carries more around it (`agg_`,
`.json`/`.jsonl`, and a temp file's `.<name>.<pid>.<random>.tmp` while it is written), so names
are held to `MAX_NAME_BYTES`. A longer name keeps its readable start and ends with a digest of
the whole name: two long names that differ anywhere stay two names.
"""

from __future__ import annotations

import hashlib

# 255 less what is put around a point's name: `agg_` + `.json`, or a temp file's dot, `.json`,
# pid (at most 7 digits), mkstemp's 8 random characters and `.tmp` with their dots.
MAX_NAME_BYTES = 200
DIGEST_CHARS = 12  # hex digits: 48 bits, no two names of a run share one by chance


def digest(text: str, chars: int = DIGEST_CHARS) -> str:
    """A short stable digest of `text` (the same text gives the same digest on every run)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:chars]


def bounded(name: str, limit: int = MAX_NAME_BYTES) -> str:
    """`name` when it fits in `limit` UTF-8 bytes; else its readable start, `-`, and a digest
    of the whole name, `limit` bytes in all (a character is never cut in half)."""
    encoded = name.encode("utf-8", "surrogatepass")
    if len(encoded) <= limit:
        return name
    tail = f"-{digest(name)}"
    start = encoded[:limit - len(tail)].decode("utf-8", "ignore")
    return start + tail
