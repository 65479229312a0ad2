"""The anchor of `kart bench model`: transformers and PyTorch eager on the model kart saved.

Usage: model_anchor.py MODEL_DIR [DEVICE [DTYPE]]. Loads the folder onto DEVICE (`cpu`, the
default, or `cuda`) with parameters of DTYPE (`float32`, the default, or `bfloat16`; torch's
default threads), prints one JSON line {"threads", "torch", "transformers"}, then answers one JSON
request per input line with one JSON line, so that kart can interleave its own runs with the
anchor's (each timed to the end of the GPU's work):

  {"op": "generate", "prompts": [[int]], "new_tokens": int}
      -> {"seconds": float, "tokens": [[int]]}
      greedy `model.generate`, exactly `new_tokens` tokens, under `torch.inference_mode`;
  {"op": "train", "input_ids": [[int]]}
      -> {"seconds": float, "loss": float}
      forward, loss = -mean log p(next token) (log_softmax and gather over the logits), backward;
  {"op": "logits", "input_ids": [[int]], "out": path}
      -> {}
      the logits of every position, as f32 on the CPU, into the safetensors file `out` (`logits`).
"""

import json
import sys
import time

import safetensors.torch
import torch
import transformers
from transformers import AutoModelForCausalLM


def generate(model, prompts, new_tokens):
    ids = torch.tensor(prompts, device=model.device)
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
    ids = torch.tensor(input_ids, device=model.device)
    logits = model(input_ids=ids).logits
    logprobs = logits[:, :-1].float().log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    loss = -logprobs.mean()
    loss.backward()
    model.zero_grad(set_to_none=True)
    return {"loss": loss.item()}


def logits(model, input_ids, out):
    ids = torch.tensor(input_ids, device=model.device)
    with torch.inference_mode():
        values = model(input_ids=ids).logits.float().cpu()
    safetensors.torch.save_file({"logits": values.contiguous()}, out)
    return {}


def main(model_dir, device="cpu", dtype="float32"):
    transformers.utils.logging.disable_progress_bar()
    device = torch.device(device)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device)
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
        elif request["op"] == "logits":
            model.eval()
            reply = logits(model, request["input_ids"], request["out"])
        else:
            raise ValueError(f"unknown op {request['op']!r}")
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        reply["seconds"] = time.perf_counter() - start
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
