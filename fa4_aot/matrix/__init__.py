"""What to build: the variants file, the model catalog, Hugging Face configs, and the work a model asks for."""
