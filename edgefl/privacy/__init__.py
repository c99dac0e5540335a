"""Differential privacy for what devices send: declarations, mechanisms, accounting, and the seam
that wraps a method's halves (docs/privacy.md).

Imports ``dp-accounting`` (the server extra) only where ε is computed: importing the declarations
stays cheap for algorithms.
"""

from edgefl.privacy.declare import (
    OPTION_KEYS,
    SENSITIVITY,
    ClassStats,
    PrivacySettings,
    Release,
    split_privacy_options,
)

__all__ = ["OPTION_KEYS", "SENSITIVITY", "ClassStats", "PrivacySettings", "Release",
           "split_privacy_options"]
