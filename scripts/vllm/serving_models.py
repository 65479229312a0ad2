"""Makes the fixture models a real vLLM on the CPU can serve, with transformers' oracle outputs.

vLLM's CPU attention takes head sizes of 32, 64, 80, ... only, so ../shared's tiny models (head
size 16) cannot be served. This writes two more, the same way those were made and in the same
format (see ../shared/fixtures/README.md), from a seed:

- `serve-qwen2`: `Qwen2ForCausalLM` (q/k/v biases, tied embeddings, the classic top-level
  `rope_theta`), hidden 128, 4 heads of 32, 2 KV heads;
- `serve-llama`: `LlamaForCausalLM` (no biases, untied, `rope_parameters`), hidden 128, 4 heads
  of 32, 4 KV heads.

Both take tiny-qwen2's byte-level BPE tokenizer and ChatML template, random weights (normal,
std `--std`), float32. Beside each: `expected.json` (`cases[i]`: `prompt`, `input_ids`,
`greedy_continuation` of `--tokens` greedy tokens, end-of-sequence tokens included, `decoded_continuation`, and `greedy_margins`,
the top-1 minus top-2 logit at each greedy step: where it is below a tolerance two correct engines
may pick different tokens) and `expected.safetensors` (`logits_{i}` of the prompt and
`greedy_logprobs_{i}`, each greedy token's log-probability under teacher forcing).

Usage: serving_models.py SHARED OUT [--seed N] [--prompts N] [--tokens N] [--std S]
"""

import argparse
import json
import random
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

parser = argparse.ArgumentParser()
parser.add_argument("shared", type=Path, help="../shared (its tiny-qwen2 gives the tokenizer)")
parser.add_argument("out", type=Path)
parser.add_argument("--seed", type=int, default=20261128)
parser.add_argument("--prompts", type=int, default=32)
parser.add_argument("--tokens", type=int, default=16)
parser.add_argument("--std", type=float, default=0.1)
args = parser.parse_args()

COMMON = dict(
    vocab_size=366,
    hidden_size=128,
    num_attention_heads=4,
    num_hidden_layers=2,
    hidden_act="silu",
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    use_cache=True,
)
MODELS = {
    "serve-qwen2": (
        Qwen2ForCausalLM,
        Qwen2Config(**COMMON, num_key_value_heads=2, intermediate_size=256, tie_word_embeddings=True,
                    rope_theta=10000.0),
    ),
    "serve-llama": (
        LlamaForCausalLM,
        LlamaConfig(**COMMON, num_key_value_heads=4, head_dim=32, intermediate_size=320,
                    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
    ),
}
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]
WORDS = ("who was born in Paris capital of France Peru Lima Hamlet wrote the river longest "
         "answer question search think 北京 Zürich 42 + 7 = ? <answer> </answer> <search> "
         "information year when did first").split()


def prompts(rng: random.Random, n: int) -> list[str]:
    """`n` prompts: raw word sequences and ChatML turns of them, of varied lengths."""
    out = []
    for i in range(n):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12)))
        out.append(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n" if i % 2 else text)
    return out


def oracle(model, tokenizer, prompt: str) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """The case of `prompt`: greedy decoding by transformers, the prompt's logits, and each
    greedy token's log-probability under teacher forcing."""
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    continuation = []
    with torch.no_grad():
        # The argmax of the full distribution at every step, end-of-sequence tokens included (as
        # engines decode with `ignore_eos`; `generate`'s `min_new_tokens` would mask them).
        for _ in range(args.tokens):
            step = model(torch.tensor([ids + continuation])).logits[0, -1]
            continuation.append(int(step.argmax()))
        logits = model(torch.tensor([ids + continuation])).logits[0].float()
    steps = logits[len(ids) - 1:-1]
    logprobs = torch.log_softmax(steps, dim=-1)
    greedy = logprobs.gather(1, torch.tensor(continuation)[:, None])[:, 0]
    top2 = steps.topk(2, dim=-1).values
    case = {
        "prompt": prompt,
        "input_ids": ids,
        "greedy_continuation": continuation,
        "decoded_continuation": tokenizer.decode(continuation),
        "greedy_margins": (top2[:, 0] - top2[:, 1]).tolist(),
    }
    return case, logits[:len(ids)].contiguous(), greedy.contiguous()


def make(name: str, seed: int) -> None:
    cls, config = MODELS[name]
    folder = args.out / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    torch.manual_seed(seed)
    config.initializer_range = args.std
    model = cls(config).float().eval()
    with torch.no_grad():
        for name_, p in model.named_parameters():
            if "norm" not in name_:  # the RMSNorms' weights stay 1
                p.normal_(0.0, args.std)
    model.save_pretrained(folder)
    source = args.shared / "fixtures/models/tiny-qwen2"
    for file in TOKENIZER_FILES:
        shutil.copy(source / file, folder / file)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    cases, tensors = [], {}
    for i, prompt in enumerate(prompts(random.Random(seed), args.prompts)):
        case, logits, greedy = oracle(model, tokenizer, prompt)
        cases.append(case)
        tensors[f"logits_{i}"] = logits
        tensors[f"greedy_logprobs_{i}"] = greedy
    example = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                            add_generation_prompt=True)
    family = config.model_type
    (folder / "expected.json").write_text(json.dumps(
        {"family": family, "cases": cases, "chat_template_example": example}, ensure_ascii=False, indent=1))
    save_file(tensors, str(folder / "expected.safetensors"))


for offset, name in enumerate(MODELS):
    make(name, args.seed + offset)
print(f"serving fixtures in {args.out}: {', '.join(MODELS)}")
