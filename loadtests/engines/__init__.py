"""Real serving engines (llama.cpp, vLLM CPU) built and started on this machine for tests."""
