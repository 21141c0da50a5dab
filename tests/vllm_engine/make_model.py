"""Make a small real model for vLLM offline: random weights, a real tokenizer. TEST INFRASTRUCTURE.

Runs inside the engine image (tests/vllm_engine/image.py), which has torch, transformers and
tokenizers: `python3 make_model.py OUT_DIR`. Writes a Llama-architecture checkpoint vLLM serves as
it would any Hugging Face folder (config.json, model.safetensors, generation_config.json) and a
byte-level BPE tokenizer trained here on text the image already has (Python's standard library), with
a chat template in tokenizer_config.json. The shapes follow the field notes' measurements on a 2-core
machine: hidden 256, 2 layers, 4 heads of 64 (vLLM's CPU attention has no head size 16), 2 KV heads.
Weights are random (a fixed seed): the output is nonsense, which is all a serving test needs, and
greedy decoding of it repeats itself, so ngram speculative decoding has drafts to accept.
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path

VOCAB = 1024
MAX_POSITIONS = 4096
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]


def corpus() -> list[str]:
    """Text every image of this recipe has: the docstrings and comments of a few standard modules."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    names = ["argparse.py", "textwrap.py", "json/decoder.py", "http/client.py", "email/message.py", "string.py"]
    return [(lib / name).read_text(encoding="utf-8") for name in names if (lib / name).is_file()]


def make_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    bos = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                             special_tokens=[("<s>", bos)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   model_max_length=MAX_POSITIONS)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def make_weights(out: Path, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, max_position_embeddings=MAX_POSITIONS, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=False, torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    make_tokenizer(args.out)
    make_weights(args.out, args.seed)
    print(json.dumps(sorted(p.name for p in args.out.iterdir())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
