"""The Lookahead Reasoning core: steps, verifiers (judges), the loop, the request, metrics and calibration."""
