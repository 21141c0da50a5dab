"""Pure arithmetic of a model against a GPU, beneath the features: the keys of a config.json that size it
(shape), its weights and one sequence's KV cache against a GPU's memory (memory), the compute capability its
quantization needs in vLLM (variant). No I/O: the fit (rigkit.fit) reads what it needs on the rig or the hub,
and the catalog's variants (rigkit.config.variants) are chosen from the rig file with it."""
