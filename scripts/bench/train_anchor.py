"""The anchor of `kart bench train`: GRPO optimisation steps in PyTorch, as verl's actor runs them,
on one process or data-parallel under torchrun (DistributedDataParallel over Gloo on the CPU,
NCCL on CUDA).

Usage: torchrun --nproc-per-node N train_anchor.py MODEL_DIR BATCH_JSON STEPS OUT_JSON DEVICE \
           [PRECISION [CHECKPOINTING [TRAINED]]]

Every rank loads MODEL_DIR twice (the policy and the frozen reference; f32 weights,
OMP_NUM_THREADS threads), computes in PRECISION (`f32`, the default, or `bf16`: autocast to
bfloat16 over the f32 weights), with transformers' gradient checkpointing when CHECKPOINTING is
`checkpointing` (`keep`, the default, keeps the activations). TRAINED is `full` (the default:
every weight) or `lora:R`: PEFT's LoRA adapters of rank R on every linear projection (alpha 2R,
no dropout) over the base loaded once, which with its adapters disabled is the reference; only
the adapters get gradients, clipping and AdamW. Each rank reads the global batch

  {"input_ids": [[int]], "prompt_len": int, "rewards": [float], "groups": [int]}

of which rank r computes rows r, r + N, ...; then it runs 1 + STEPS steps, each timed from a
barrier to the end of the optimiser step, and rank 0 writes OUT_JSON:

  {"threads", "torch", "transformers", "steps": [{"seconds", "entropy", "kl", "pg_loss", "grad_norm"}]}

A step: GRPO advantages of the whole batch (group mean and unbiased std, epsilon 1e-6) on the
response tokens; old log-probabilities and the entropy (logged, as verl does from this pass) and
reference log-probabilities without gradients; the policy's log-probabilities with gradients
(through DDP); the PPO-clip loss (clip 0.2, dual clip 3) and the low-variance KL loss
(coefficient 0.001), both means over the tokens of the whole batch; backward (DDP averages the
gradients); gradient clipping at norm 1; AdamW (lr 1e-6, weight decay 0.01). Log-probabilities
come from the full logits sliced to the response, as verl computes them.
"""

import contextlib
import gc
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import transformers
from torch.nn.parallel import DistributedDataParallel
from transformers import AutoModelForCausalLM


def logprobs(model, ids, start, with_entropy=False):
    logits = model(input_ids=ids).logits[:, start:-1].float()
    logp = logits.log_softmax(-1)
    chosen = logp.gather(-1, ids[:, start + 1 :, None]).squeeze(-1)
    if with_entropy:
        return chosen, -(logp.exp() * logp).sum(-1)
    return chosen


def grpo_advantages(rewards, groups):
    rewards, groups = torch.tensor(rewards), torch.tensor(groups)
    advantages = torch.zeros_like(rewards)
    for g in groups.unique():
        members = groups == g
        scores = rewards[members]
        std = scores.std() if scores.numel() > 1 else torch.tensor(1.0)
        mean = scores.mean() if scores.numel() > 1 else torch.tensor(0.0)
        advantages[members] = (scores - mean) / (std + 1e-6)
    return advantages


def step(policy, trained, reference, optimizer, batch, rank, world, device, precision):
    """One GRPO step; `reference` is a model, or a context in which `policy` is the reference."""
    rows = slice(rank, None, world)
    all_ids = torch.tensor(batch["input_ids"])
    ids = all_ids[rows].to(device)
    start = batch["prompt_len"] - 1
    advantages = grpo_advantages(batch["rewards"], batch["groups"])[rows, None].to(device)
    # Means over the whole batch's tokens: each rank's sums over its own, times the world size
    # that DDP's gradient average divides by.
    tokens = all_ids.shape[0] * (all_ids.shape[1] - 1 - start)
    scale = world / tokens
    with precision(), torch.no_grad():
        old, entropy = logprobs(policy, ids, start, with_entropy=True)
        if isinstance(reference, torch.nn.Module):
            ref = logprobs(reference, ids, start)
        else:
            with reference():
                ref = logprobs(policy, ids, start)
    with precision():
        new = logprobs(trained, ids, start)
    ratio = torch.exp(torch.clamp(new - old, -20.0, 20.0))
    clipped = torch.maximum(-advantages * ratio, -advantages * torch.clamp(ratio, 0.8, 1.2))
    token_loss = torch.where(advantages < 0, torch.minimum(-advantages * 3.0, clipped), clipped)
    pg_loss = token_loss.sum() * scale
    d = torch.clamp(ref - new, -20.0, 20.0)
    kl = torch.clamp(torch.exp(d) - d - 1, -10.0, 10.0).sum() * scale
    loss = pg_loss + 0.001 * kl
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_([p for p in policy.parameters() if p.requires_grad], 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    logged = torch.stack([entropy.sum() / tokens, kl.detach() / world, pg_loss.detach() / world])
    if world > 1:
        dist.all_reduce(logged)
    return {"entropy": logged[0].item(), "kl": logged[1].item(), "pg_loss": logged[2].item(),
            "grad_norm": grad_norm.item()}


def main(model_dir, batch_path, steps, out, device_kind, precision="f32", checkpointing="keep", trained_part="full"):
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if device_kind == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    transformers.utils.logging.disable_progress_bar()
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    if checkpointing == "checkpointing":
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if trained_part.startswith("lora:"):
        import peft

        r = int(trained_part.removeprefix("lora:"))
        config = peft.LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules="all-linear")
        policy = peft.get_peft_model(policy, config)
        reference = policy.disable_adapter
    else:
        reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
        reference.eval().requires_grad_(False)
    policy.train()
    if precision == "bf16":
        autocast = lambda: torch.autocast(device.type, dtype=torch.bfloat16)  # noqa: E731
    else:
        autocast = contextlib.nullcontext
    trained = DistributedDataParallel(policy, device_ids=[device] if device.type == "cuda" else None) if world > 1 else policy
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-6, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    with open(batch_path) as f:
        batch = json.load(f)
    stepped = []
    for _ in range(1 + int(steps)):
        if world > 1:
            dist.barrier()
        begin = time.perf_counter()
        reply = step(policy, trained, reference, optimizer, batch, rank, world, device, autocast)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        reply["seconds"] = time.perf_counter() - begin
        stepped.append(reply)
    if rank == 0:
        report = {
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "steps": stepped,
        }
        with open(out, "w") as f:
            json.dump(report, f)
    if world > 1:
        # Tear down together, and drop DDP (its reducer holds the group) first: a group left to
        # the interpreter's finalisation can abort the process from Gloo's worker threads.
        dist.barrier()
        del trained
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
