"""Multi-GPU topology preflight (issue #34): what links a tensor/pipeline-parallel model's
GPUs talk over, whether peer-to-peer (P2P) is usable there, and what vLLM must be told.

`parse` reads what the rig prints (nvidia-smi topo -m / -p2p r, the PCIe query, the kernel
command line, lspci's ACSCtl lines); `decide` turns it into a verdict per model. Both are
pure: no pyinfra. See docs/topology.md.
"""
