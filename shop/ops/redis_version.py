"""Whether the Redis server has the fixes of its known Lua flaws (`flask shop check`'s
`redis-version`). The shop runs Lua scripts on Redis (RQ, the provider guard) and cannot turn
scripting off, so a Redis whose Lua engine can be made to run code is one password away from the
machine it runs on.

The rule is the minimum patch release per minor line: the releases of October 2025 that fixed a
Lua script's use-after-free leading to remote code execution (CVE-2025-49844) and, with it, an
integer overflow (CVE-2025-46817), a script run as another user (CVE-2025-46818) and an
out-of-bounds read (CVE-2025-46819). A line newer than the last one listed was released with the
fixes; a line not listed and older (7.0, 6.0 and before) never got them: only an upgrade helps."""

from __future__ import annotations

import re

from .checks import OK, WARN, Check

# (major, minor) -> the first patch release of that line with the fixes.
LUA_FIXED = {(6, 2): 20, (7, 2): 11, (7, 4): 6, (8, 0): 4, (8, 2): 2}
FIXED_IN = ", ".join(f"{major}.{minor}.{patch}" for (major, minor), patch in LUA_FIXED.items())
FIXED_IN = FIXED_IN.rpartition(", ")[0] + " or " + FIXED_IN.rpartition(", ")[2]


def lua_fix_missing(version: str) -> str | None:
    """Why `version` (INFO's redis_version) lacks the Lua fixes, in words; None when it has them
    or cannot be read."""
    found = re.match(r"(\d+)\.(\d+)\.(\d+)", version or "")
    if not found:
        return None
    major, minor, patch = (int(part) for part in found.groups())
    needed = LUA_FIXED.get((major, minor))
    if needed is not None:
        first = f"{major}.{minor}.{needed}"
        return None if patch >= needed else f"older than {first}, the first release of its line with the fixes"
    if (major, minor) > max(LUA_FIXED):
        return None
    return f"of the {major}.{minor} line, which never had a release with the fixes"


def redis_version_check(version: str | None, where: str) -> Check:
    missing = lua_fix_missing(version or "")
    if not version:
        return Check("redis-version", WARN, f"{where} did not say its version: make it at least one of {FIXED_IN}")
    if missing is None:
        return Check("redis-version", OK, f"Redis {version}, with the fixes of its known Lua flaws")
    return Check(
        "redis-version",
        WARN,
        f"Redis {version} at {where} is {missing}: a Lua script can run code on its machine (CVE-2025-49844) or "
        f"as another user; upgrade to {FIXED_IN} or later on its line (or a newer line), "
        "and keep it reachable only by the shop, with a password",
    )
