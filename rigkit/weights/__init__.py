"""Weights (role weights, templates/weights/): model weights copied onto Docker volumes
through the rig's Docker Engine, with a manifest and a completion marker written last."""
