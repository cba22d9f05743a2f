"""Evaluation: datasets and answer checking, the code sandbox, the synthetic task, the eval runner."""
