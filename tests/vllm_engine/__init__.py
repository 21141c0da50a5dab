"""The real vLLM engine for the simulated rig: its CPU build in an image built here, and small
models made offline for it. TEST INFRASTRUCTURE (docs/simulated-rig.md)."""
