"""Names that become unit and directory names (engine groups, models, revisions)."""

from __future__ import annotations

import re

# One path component: no separator, and a letter or digit first ('.' and '..' would name a
# directory's parent, '-' would read as an option).
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
SAFE_NAME_RULE = "letters, digits, '.', '_' or '-' only, a letter or digit first"


def is_safe_name(value: object) -> bool:
    return isinstance(value, str) and SAFE_NAME.fullmatch(value) is not None
