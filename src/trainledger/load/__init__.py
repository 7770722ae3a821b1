"""Everything that reads a file or resolves a name: catalog, Hugging Face configs, plan files."""
