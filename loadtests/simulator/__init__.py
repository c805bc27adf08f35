"""A simulated LLM engine replica (vLLM, SGLang or llama.cpp flavoured).

It stands in for a real engine wherever routing cares: the OpenAI wire format, a real
block-hash prefix cache with LRU eviction, continuous batching with a timing model, the
engine's own /metrics names, and fault knobs for tests. It knows nothing of the proxy.

Run: ``python -m loadtests.simulator --port P --dialect vllm|sglang|llamacpp`` (``--help``
lists the timing, cache and fault flags). Endpoints:

- POST /v1/chat/completions, /v1/completions (stream or not), /v1/responses, /v1/messages,
  /v1/embeddings; GET /v1/models, /health, /metrics (in the dialect's names).
- llama.cpp dialect: GET /slots, /props. SGLang dialect: GET /server_info, /model_info.
- GET /sim/stats[?records=0][&hashes=0]: totals and per-request records, including the
  prompt's chained ``block_hashes`` (for the oracle hit rate, see loadtests.oracle).
- POST /sim/reset: clear stats and cache, restore the start-up fault knobs.
- GET/POST /sim/config: read or change fault knobs (JSON, see ``config.Faults``).

Prompt text is rendered with a ChatML Jinja2 template (templates/chatml.jinja, or
``--chat-template``); a token is 4 characters of it (see ``prompt``).
"""
