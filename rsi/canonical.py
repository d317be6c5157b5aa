"""The one canonical encoding of structured values that rsi hashes.

Sorted keys, no insignificant whitespace, UTF-8, no NaN. Anything that feeds a key goes through
`canonical_bytes`; nothing else may serialise a value that is hashed.
"""

from __future__ import annotations

import json
from typing import Any


def canonical_bytes(value: Any) -> bytes:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")
