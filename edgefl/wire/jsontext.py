"""The wire's JSON: the one reader of whatever a device sends (:func:`parse_json`: envelope
headers and metadata, registration profiles, model reports) and the writer of what edgefl sends
(:func:`json_writer`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from edgefl.errors import WireError


def json_writer(**options: Any) -> Callable[[dict[str, Any]], str]:
    """``json.dumps(obj, **options)`` for a dict, its C encoder built once: json.dumps with any
    argument builds a JSONEncoder at each call, and JSONEncoder.encode its C encoder at each call
    (a third of the time of a small header). Without the circular-reference check, which the
    C encoder would keep state for across calls: what is written here is built here (routing
    fields, tensor entries) or a payload's metadata, already checked to hold scalars only
    (:func:`~edgefl.wire.schema.check_meta`). The same text as json.dumps (a test holds it)."""
    encoder = json.JSONEncoder(**options)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None or encoder.indent is not None:  # no C accelerator: the Python encoder
        return encoder.encode
    c_encode = make(
        None, encoder.default,
        json.encoder.encode_basestring_ascii if encoder.ensure_ascii
        else json.encoder.encode_basestring,
        None, encoder.key_separator, encoder.item_separator, encoder.sort_keys,
        encoder.skipkeys, encoder.allow_nan,
    )
    return lambda obj: "".join(c_encode(obj, 0))


def nesting(value: Any) -> int:
    """The nesting depth of a parsed JSON value (0 for a scalar), level by level (no recursion)."""
    depth, level = 0, [value]
    while True:
        below: list[Any] = []
        containers = False
        for v in level:
            if isinstance(v, dict):
                below.extend(v.values())
                containers = True
            elif isinstance(v, list):
                below.extend(v)
                containers = True
        if not containers:
            return depth
        depth += 1
        level = below


def parse_json(raw: bytes | str, *, max_bytes: int, max_depth: int, what: str) -> Any:
    """``raw`` parsed as JSON, every bound checked in time linear in its bytes: its size first,
    then ``json.loads`` (linear; it stops a deep text by itself at the interpreter's recursion
    limit, a RecursionError refused here like any other defect, with no second pass over the text
    to measure how deep it went), then the nesting of what it returned (a walk of the parsed value,
    bounded by its size). Every failure is a WireError. The one JSON reader for whatever a device
    sends: envelope headers and metadata, registration profiles, model reports."""
    return parse_json_depth(raw, max_bytes=max_bytes, max_depth=max_depth, what=what)[0]


def parse_json_depth(
    raw: bytes | str, *, max_bytes: int, max_depth: int, what: str
) -> tuple[Any, int]:
    """:func:`parse_json`'s value and its nesting depth."""
    if len(raw) > max_bytes:
        raise WireError(f"{what} of {len(raw)} bytes exceeds the limit of {max_bytes}")
    try:
        value = json.loads(raw)
    except RecursionError:
        raise WireError(
            f"{what} nests deeper than the parser's recursion limit (limit {max_depth})"
        ) from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise WireError(f"{what} is not JSON: {str(e)[:200]}") from None
    depth = nesting(value)
    if depth > max_depth:
        raise WireError(f"{what} nests {depth} deep (limit {max_depth})")
    return value, depth
