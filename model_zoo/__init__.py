"""What a model is: networks, named configs, safetensors loading, the embedded default weights."""
