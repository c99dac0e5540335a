"""One-off diagnostics behind the Felo/Velo page: each reads or runs cells, writes its page."""
