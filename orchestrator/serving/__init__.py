"""Serving glue: Triton models' library side, the server launcher, clients and the OpenAI-compatible front."""
