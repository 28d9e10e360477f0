"""tokenpace: Token Window Pacing, closed-loop step-level admission control for LLM serving."""

__version__ = "0.1.0"
