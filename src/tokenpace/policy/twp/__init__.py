"""Token Window Pacing: monitor, window controller, KV guard, ranking, gate, chunked prefill."""
