"""Does a model fit its GPUs? Its weights and the KV cache of one sequence of its context, per GPU, against
the memory vLLM may take there (docs/serving.md, "Does it fit"). `shape` reads a model's config.json, `memory`
does the arithmetic and says what would fit, `facts` reads both from the rig before anything changes."""
