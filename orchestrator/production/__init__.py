"""The production build: engine specs (YAML) and the TensorRT-LLM engine builds."""
