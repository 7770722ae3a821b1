"""Reports a planner can hand to a CTO or a vendor: text, JSON, Markdown and self-contained HTML.

``build_report(inputs, ...)`` computes everything (estimate, what-if sweeps, procurement and
acceptance sheet, risks, upgrade triggers; planner and verify results when given);
``render(data, fmt)`` formats it; ``write_atomic(path, text)`` writes it via temp file + rename.
Renderers never compute: they format and draw what the library returned.
"""

from trainledger.report.data import ReportData, build_report, inputs_from_plan_result, read_json, verify_section
from trainledger.report.render import FORMATS, format_for, render
from trainledger.safety import write_atomic
from trainledger.planner.sweeps import DEFAULT_COMPARE_GPUS

__all__ = ["ReportData", "build_report", "inputs_from_plan_result", "read_json", "verify_section",
           "FORMATS", "format_for", "render", "write_atomic", "DEFAULT_COMPARE_GPUS"]
