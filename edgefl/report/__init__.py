"""Run outputs: metrics files, summaries and plots."""

from edgefl.report.recorder import RunRecorder, read_rounds

__all__ = ["RunRecorder", "read_rounds"]
