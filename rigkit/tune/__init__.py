"""`rigkit tune` (issue #18): sweep power limits, clock locks and clock offsets, and pick a setting.

The pure core: grid parsing, the safety screen, the drift-cancelling order, the statistics, the
took-effect verdicts, the sweep driver (against any object that follows `rigkit.tune.sweep.Rig`)
and the rig-file change. Around it: the helper shipped to the rig with its dead man's switch
(`rigside`), the rig over SSH (`remote`), one measurement and the `--hold` loop (`measure`), and
the command (`command`, `session`, `report`). See docs/tune.md.
"""
