"""rsi: a hermetic, content-addressed build graph for inference-optimisation campaigns."""

__version__ = "0.1.0"
