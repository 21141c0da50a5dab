"""Serving (role serving, templates/serving/): what a served model becomes on the rig
(the `vllm serve` command line, its compose file, readiness settings), the API key
file, and the fact that reads the stacks' state."""
