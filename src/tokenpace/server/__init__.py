"""``tokenpace serve``: an OpenAI-compatible streaming API over real engines, policy in charge.

Importing this package needs the ``serve`` extra (fastapi, uvicorn, prometheus-client) and,
for the native engine, the ``native`` extra. Entry point: ``tokenpace.server.main.serve``.
"""
