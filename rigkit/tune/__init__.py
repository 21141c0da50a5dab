"""`rigkit tune` (issue #18): sweep power limits, clock locks and clock offsets, and pick a setting.

This package is the pure core: grid parsing, the safety screen, the drift-cancelling order,
the statistics, the took-effect verdicts, the sweep driver (against any object that follows
`rigkit.tune.sweep.Rig`) and the rig-file change. The rig-side `Rig` and the command are not
built yet; see docs/tune.md.
"""
