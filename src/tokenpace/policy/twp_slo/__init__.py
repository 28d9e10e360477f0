"""SLO-targeted TWP: the window sized for an ITL target, deadline-aware ranking, and a
prefill budget from the ITL headroom."""
