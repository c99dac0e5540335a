"""Wire format: envelopes, payloads, schemas, and the arrays ↔ state-dict helpers."""

from edgefl.wire.envelope import (
    Envelope,
    Limits,
    Payload,
    check,
    checked_size,
    decode,
    encode,
    encoded_size,
    new_nonce,
)
from edgefl.wire.schema import (
    KINDS,
    REPLY_KINDS,
    SCHEMA_VERSION,
    ArraySpec,
    array_spec,
    in_group,
    spec_of,
)
from edgefl.wire.tensors import arrays_to_state, state_to_arrays

__all__ = [
    "KINDS",
    "REPLY_KINDS",
    "SCHEMA_VERSION",
    "ArraySpec",
    "Envelope",
    "Limits",
    "Payload",
    "array_spec",
    "arrays_to_state",
    "check",
    "checked_size",
    "decode",
    "encode",
    "encoded_size",
    "in_group",
    "new_nonce",
    "spec_of",
    "state_to_arrays",
]
