"""The model: providers and their settings, the built-in script model, retries of a failed
request, and what a response used and cost."""
