"""rigkit: provision, re-apply and verify local LLM inference rigs with pyinfra."""

__version__ = "0.1.0"
