"""Matched-budget benchmarks: several training arms, several seeds, one comparison.

Rooms: :mod:`.config` (the config file, each cell's recipe), :mod:`.results` (the
``results.json`` schema; a finished run read into a cell), :mod:`.stats` (means,
paired bootstrap intervals, the summary table), :mod:`.run` (the cells, resume, the
default cell that trains), :mod:`.html` (the offline page) and :mod:`.export` (a
shareable, redacted hardware result).

Everything but a default cell's training is torch-free. Import what you need from its
modules; this file exports nothing. Run with ``miniverl benchmark CONFIG``.
"""
