"""A byte-level BPE vocabulary trained on local text, so tiny models need no model hub."""

from __future__ import annotations

import importlib

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

BOS_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (BOS_TOKEN, IM_START, IM_END)
VOCAB_SIZE = 512

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_CORPUS_MODULES = ("asyncio", "collections", "functools", "json", "os", "pathlib", "re", "string")


def local_corpus() -> list[str]:
    """Docstrings of a few stdlib modules: real English text that is already on every machine."""
    texts: list[str] = []
    for name in _CORPUS_MODULES:
        module = importlib.import_module(name)
        for value in vars(module).values():
            doc = getattr(value, "__doc__", None)
            if isinstance(doc, str):
                texts.append(doc)
    return texts


def train_tokenizer(vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """Train a GPT-2 style byte-level BPE whose first ids are the ChatML special tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(local_corpus(), trainer=trainer)
    return tokenizer
