"""The monitoring pack (docs/monitoring.md): what roles/monitoring.py installs on a Linux rig."""
