"""context-gateway: an OpenAI-compatible proxy that bounds prompts and remembers conversations."""

__version__ = "0.1.0"
