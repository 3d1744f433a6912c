"""Stripe's form encoding: bracketed keys into nested dicts and lists, and typed reads.

The SDK flattens nested params the way Rails does: `line_items[0][price_data][currency]=usd`,
`metadata[order_id]=42`, `enabled_events[0]=*` (and `expand[]=x` from older clients). Every
value arrives as a string; the typed readers below turn them into ints and booleans with
Stripe's own refusal messages.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from .errors import invalid

_KEY = re.compile(r"^([^\[\]]+)((?:\[[^\[\]]*\])*)$")
_PART = re.compile(r"\[([^\[\]]*)\]")

# Keys under these names are free-form strings even when they look like indices.
_FREE_FORM = {"metadata"}


def parse_form(pairs: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """Turn decoded `(key, value)` pairs into nested dicts and lists.

    Containers are built as dicts first; a dict whose keys are all decimal indices becomes a
    list ordered by index (except under `metadata`, whose keys are the caller's own).
    """
    root: dict[str, Any] = {}
    for raw_key, value in pairs:
        match = _KEY.match(raw_key)
        if not match:
            raise invalid(f"Invalid parameter name: {raw_key}", raw_key)
        parts = [match.group(1), *_PART.findall(match.group(2))]
        node = root
        for depth, part in enumerate(parts):
            last = depth == len(parts) - 1
            if part == "":
                if not last:
                    raise invalid(f"Invalid parameter name: {raw_key}", raw_key)
                part = str(len(node))
            if last:
                if isinstance(node.get(part), dict):
                    raise invalid(f"Invalid value for {raw_key}: expected a hash", raw_key)
                node[part] = value
            else:
                child = node.setdefault(part, {})
                if not isinstance(child, dict):
                    raise invalid(
                        f"Invalid value for {'['.join(parts[: depth + 1])}: cannot be both a value and a hash",
                        raw_key,
                    )
                node = child
    return _listify(root, parent_key=None)


def _listify(node: Any, parent_key: str | None) -> Any:
    if not isinstance(node, dict):
        return node
    converted = {key: _listify(value, key) for key, value in node.items()}
    if converted and parent_key not in _FREE_FORM and all(key.isdigit() for key in converted):
        return [converted[key] for key in sorted(converted, key=int)]
    return converted


def param_name(*path: Any) -> str:
    """`("line_items", 0, "quantity")` -> `line_items[0][quantity]`, as Stripe names params."""
    head, *rest = (str(p) for p in path)
    return head + "".join(f"[{p}]" for p in rest)


def read_str(value: Any, param: str, *, max_length: int | None = None) -> str | None:
    """A string param; the empty string means "unset" as it does at Stripe."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise invalid(f"Invalid string: {_show(value)}", param, "parameter_invalid_string")
    if max_length is not None and len(value) > max_length:
        raise invalid(
            f"Invalid string: {value[:20]}...; must be at most {max_length} characters",
            param,
            "parameter_invalid_string",
        )
    return value


def read_int(value: Any, param: str, *, minimum: int | None = None, maximum: int | None = None) -> int | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not re.fullmatch(r"-?\d+", value.strip()):
        raise invalid(f"Invalid integer: {_show(value)}", param, "parameter_invalid_integer")
    number = int(value)
    if minimum is not None and number < minimum:
        raise invalid(
            f"This value must be greater than or equal to {minimum}.",
            param,
            "parameter_invalid_integer",
        )
    if maximum is not None and number > maximum:
        raise invalid(
            f"This value must be less than or equal to {maximum}.",
            param,
            "parameter_invalid_integer",
        )
    return number


def read_bool(value: Any, param: str) -> bool | None:
    if value is None or value == "":
        return None
    if value in ("true", "false"):
        return value == "true"
    raise invalid(f"Invalid boolean: {_show(value)}", param)


def read_dict(value: Any, param: str) -> dict | None:
    if value is None or value == "":
        return None
    if not isinstance(value, dict):
        raise invalid(f"Invalid hash: {param} must be a hash", param)
    return value


def read_list(value: Any, param: str) -> list | None:
    if value is None or value == "":
        return None
    if isinstance(value, dict) and not value:
        return []
    if not isinstance(value, list):
        raise invalid(f"Invalid array: {param} must be an array", param)
    return value


def read_metadata(value: Any, param: str = "metadata") -> dict[str, str]:
    """Metadata as Stripe accepts it: up to 50 string keys; an empty value unsets the key."""
    data = read_dict(value, param)
    if not data:
        return {}
    if len(data) > 50:
        raise invalid("Metadata can have at most 50 keys.", param)
    result: dict[str, str] = {}
    for key, item in data.items():
        name = param_name(param, key)
        if len(key) > 40:
            raise invalid(f"Metadata keys can be at most 40 characters: {key}", name)
        if not isinstance(item, str):
            raise invalid(f"Invalid metadata value for {key}: must be a string", name)
        if len(item) > 500:
            raise invalid(f"Metadata values can be at most 500 characters: {key}", name)
        if item != "":
            result[key] = item
    return result


def merge_metadata(current: dict[str, str], update: Any, param: str = "metadata") -> dict[str, str]:
    """An update merges keys; an empty value deletes one; `metadata=""` clears them all."""
    if update == "":
        return {}
    data = read_dict(update, param) or {}
    merged = dict(current)
    for key, item in data.items():
        if item == "":
            merged.pop(key, None)
    merged.update(read_metadata({k: v for k, v in data.items() if v != ""}, param))
    return merged


def reject_unknown(params: dict, allowed: Iterable[str]) -> None:
    allowed = set(allowed)
    for key in params:
        if key not in allowed:
            raise invalid(f"Received unknown parameter: {key}", key, "parameter_unknown")


def _show(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return "a hash" if isinstance(value, dict) else "an array"
    return str(value)
