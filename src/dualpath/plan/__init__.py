"""Closed-form planning: P/D range and link traffic (§4.2), cache-compute ratio (Table 1), working set (§8.2)."""
