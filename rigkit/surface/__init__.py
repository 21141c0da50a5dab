"""The rig's network surface: who may reach the models' ports when they listen beyond loopback (docs/security.md)."""
