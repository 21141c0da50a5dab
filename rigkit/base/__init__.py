"""The base of a Linux rig (role base, docs/base.md): Docker Engine with Compose v2, the NVIDIA
Container Toolkit from NVIDIA's apt repository, Docker's nvidia runtime, nvidia-persistenced,
and the driver's packages held against unattended upgrades. Decisions in `packages` (pure),
read-only facts in `facts`."""
