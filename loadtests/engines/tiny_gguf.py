"""A tiny llama-architecture GGUF with random weights: loads in llama-server in a blink."""

from __future__ import annotations

import json
import os
from pathlib import Path

import gguf
import numpy as np

from loadtests.engines.tiny_tokenizer import (
    BOS_TOKEN,
    CHATML_TEMPLATE,
    IM_END,
    SPECIAL_TOKENS,
    train_tokenizer,
)

MODEL_NAME = "tiny-llama"
N_LAYERS = 2
N_EMBD = 64
N_HEADS = 2
N_FF = 128
N_CTX_TRAIN = 4096
SEED = 1234


def _vocabulary() -> tuple[list[str], list[int], list[str]]:
    """Tokens in id order, their GGUF token types and the BPE merges."""
    model = json.loads(train_tokenizer().to_str())["model"]
    tokens = [token for token, _ in sorted(model["vocab"].items(), key=lambda item: item[1])]
    types = [
        gguf.TokenType.CONTROL if token in SPECIAL_TOKENS else gguf.TokenType.NORMAL
        for token in tokens
    ]
    merges = [" ".join(pair) for pair in model["merges"]]
    return tokens, types, merges


def _weights(n_vocab: int) -> dict[str, np.ndarray]:
    """Seeded random tensors, numpy shapes (out, in) as gguf expects."""
    rng = np.random.default_rng(SEED)

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    ones = np.ones(N_EMBD, dtype=np.float32)
    tensors = {
        "token_embd.weight": rand(n_vocab, N_EMBD),
        "output_norm.weight": ones,
        "output.weight": rand(n_vocab, N_EMBD),
    }
    for i in range(N_LAYERS):
        tensors |= {
            f"blk.{i}.attn_norm.weight": ones,
            f"blk.{i}.attn_q.weight": rand(N_EMBD, N_EMBD),
            f"blk.{i}.attn_k.weight": rand(N_EMBD, N_EMBD),
            f"blk.{i}.attn_v.weight": rand(N_EMBD, N_EMBD),
            f"blk.{i}.attn_output.weight": rand(N_EMBD, N_EMBD),
            f"blk.{i}.ffn_norm.weight": ones,
            f"blk.{i}.ffn_gate.weight": rand(N_FF, N_EMBD),
            f"blk.{i}.ffn_up.weight": rand(N_FF, N_EMBD),
            f"blk.{i}.ffn_down.weight": rand(N_EMBD, N_FF),
        }
    return tensors


def write_tiny_gguf(path: Path) -> Path:
    """Write the model to `path` (via a temporary file, so readers never see half a model)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokens, types, merges = _vocabulary()
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name(MODEL_NAME)
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYERS)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEADS)
    writer.add_head_count_kv(N_HEADS)
    writer.add_rope_dimension_count(N_EMBD // N_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index(BOS_TOKEN))
    writer.add_eos_token_id(tokens.index(IM_END))
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)
    for name, tensor in _weights(len(tokens)).items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
    return path
