"""Wire format: envelopes, payloads, and the arrays ↔ state-dict helpers."""

from edgefl.wire.envelope import KINDS, SCHEMA_VERSION, Envelope, Limits, Payload, decode, encode
from edgefl.wire.tensors import arrays_to_state, state_to_arrays

__all__ = [
    "KINDS",
    "SCHEMA_VERSION",
    "Envelope",
    "Limits",
    "Payload",
    "arrays_to_state",
    "decode",
    "encode",
    "state_to_arrays",
]
