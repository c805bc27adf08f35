"""A simulated LLM engine replica (vLLM, SGLang or llama.cpp flavoured).

It stands in for a real engine wherever routing cares: the OpenAI wire format, a real
block-hash prefix cache with LRU eviction, continuous batching with a timing model, the
engine's own /metrics names, and fault knobs for tests. Run it with
``python -m loadtests.simulator --port P --dialect vllm|sglang|llamacpp``.
"""
