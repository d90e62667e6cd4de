"""The report's tables, one module each (summary, confound, widths), over what they share (layout)."""
