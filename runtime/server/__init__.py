"""OpenAI-compatible HTTP server: `pagoda serve`."""
