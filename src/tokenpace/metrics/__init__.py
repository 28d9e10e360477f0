"""Request-level metrics (vLLM bench definitions) and their aggregation over seeds."""
