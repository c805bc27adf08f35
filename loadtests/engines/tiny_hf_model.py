"""A tiny llama model directory in Hugging Face layout, for vLLM; written with transformers.

Runs inside the vLLM venv (which has torch and transformers):
    VENV/bin/python -m loadtests.engines.tiny_hf_model OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from loadtests.engines.tiny_tokenizer import (
    BOS_TOKEN,
    CHATML_TEMPLATE,
    IM_END,
    train_tokenizer,
)

HIDDEN = 128
N_HEADS = 2  # head size 64, which vLLM's CPU attention supports
N_LAYERS = 2
N_FF = 256
MAX_POSITIONS = 4096
SEED = 1234


def write_tiny_hf_model(out_dir: Path) -> Path:
    """Tokenizer (with the ChatML template), config and seeded random bf16 weights."""
    out_dir = Path(out_dir)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(),
        bos_token=BOS_TOKEN,
        eos_token=IM_END,
        pad_token=BOS_TOKEN,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.save_pretrained(out_dir, save_jinja_files=False)  # template in tokenizer_config
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        intermediate_size=N_FF,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=N_HEADS,
        num_key_value_heads=N_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS_TOKEN),
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        tie_word_embeddings=False,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out_dir)
    return out_dir


if __name__ == "__main__":
    print(write_tiny_hf_model(Path(sys.argv[1])))
