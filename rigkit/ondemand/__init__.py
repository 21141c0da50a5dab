"""On-demand models (docs/on-demand.md): which models of a rig take turns on its GPUs, and what
rigkit-ondemand, the rig-side program in front of them (rigkit.rigside: front, swap, engine_control), is told."""
