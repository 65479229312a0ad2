"""The anchor of `kart bench model`: transformers and PyTorch eager on the model kart saved.

Usage: model_anchor.py MODEL_DIR. Loads the folder (f32, CPU, torch's default threads), prints one
JSON line {"threads", "torch", "transformers"}, then answers one JSON request per input line with
one JSON line, so that kart can interleave its own runs with the anchor's:

  {"op": "generate", "prompts": [[int]], "new_tokens": int}
      -> {"seconds": float, "tokens": [[int]]}
      greedy `model.generate`, exactly `new_tokens` tokens, under `torch.inference_mode`;
  {"op": "train", "input_ids": [[int]]}
      -> {"seconds": float, "loss": float}
      forward, loss = -mean log p(next token) (log_softmax and gather over the logits), backward.
"""

import json
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM


def generate(model, prompts, new_tokens):
    ids = torch.tensor(prompts)
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=0,
        )
    return {"tokens": out[:, ids.shape[1] :].tolist()}


def train(model, input_ids):
    ids = torch.tensor(input_ids)
    logits = model(input_ids=ids).logits
    logprobs = logits[:, :-1].float().log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    loss = -logprobs.mean()
    loss.backward()
    model.zero_grad(set_to_none=True)
    return {"loss": loss.item()}


def main(model_dir):
    transformers.utils.logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    versions = {"threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": transformers.__version__}
    print(json.dumps(versions), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        start = time.perf_counter()
        if request["op"] == "generate":
            model.eval()
            reply = generate(model, request["prompts"], request["new_tokens"])
        elif request["op"] == "train":
            model.train()
            reply = train(model, request["input_ids"])
        else:
            raise ValueError(f"unknown op {request['op']!r}")
        reply["seconds"] = time.perf_counter() - start
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
