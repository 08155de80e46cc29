"""Faults on purpose and how a run is judged: fault schedules, recovery tracking, goodput."""
