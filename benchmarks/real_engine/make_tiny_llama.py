"""Write a small Llama model directory, made here and the same on every run: no download.

    VENV_PYTHON benchmarks/real_engine/make_tiny_llama.py OUT_DIR

(run with the python of `vllm_cpu_env.py`'s venv: it needs torch, transformers, tokenizers).
The weights are random (seeded), the tokenizer a byte-level BPE trained on the text below,
the chat template ChatML. A model that serves, streams and counts tokens like any Llama, and
answers nonsense: evals of it are expected to fail their thresholds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SEED = 0
VOCAB_SIZE = 512
CONTEXT = 1024
# vLLM's CPU attention kernels take head sizes of 32 and up (16 is refused at the first request).
SHAPE = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 1}
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# ChatML, as Qwen-style models write it; the generation prompt opens the assistant's turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# What the BPE merges are learned from: plain English with digits and arithmetic, the kind of
# text the benchmarks' prompts and GSM8K's questions are made of.
TRAINING_TEXT = """\
The quick brown fox jumps over the lazy dog. A benchmark measures how fast a server answers.
Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.
How many clips did Natalia sell altogether in April and May? 48 / 2 = 24. 48 + 24 = 72.
Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting.
How much did she earn? 12 / 60 = 0.2 per minute, 0.2 * 50 = 10. The answer is 10.
Question: If there are 3 cars in the parking lot and 2 more cars arrive, how many cars are
in the parking lot? Answer: There are 3 cars. 2 more arrive. 3 + 2 = 5. The answer is 5.
The user asks the assistant a question and the assistant answers it step by step.
Time to first token, inter-token latency, throughput and tokens per second per user.
0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 25 30 40 50 60 70 80 90 100 1000
"""


def train_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(TRAINING_TEXT.splitlines() * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|im_end|>",
        pad_token="<|endoftext|>", unk_token="<|endoftext|>", model_max_length=CONTEXT)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))


def write_model(out: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(out))
    config = LlamaConfig(
        vocab_size=len(tok), **SHAPE, max_position_embeddings=CONTEXT,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, tie_word_embeddings=True, torch_dtype="bfloat16")
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the model directory to write")
    args = parser.parse_args(argv)
    out: Path = args.out
    done = out / "inferbench-model.json"
    made = {"seed": SEED, "vocab": VOCAB_SIZE, "context": CONTEXT, **SHAPE}
    if done.is_file() and json.loads(done.read_text()) == made:
        print(out)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    train_tokenizer(out)
    write_model(out)
    done.write_text(json.dumps(made))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
