"""rsi: a hermetic, content-addressed build graph for inference-optimisation campaigns. It holds the
version only and must never import a module of its own."""

__version__ = "0.1.0"
