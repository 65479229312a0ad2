"""A stand-in for an SGLang server that speaks the endpoints kart uses, as SGLang's HTTP server
(python/sglang/srt/entrypoints/http_server.py) defines them:

- `POST /generate`: token ids in, `meta_info.output_token_logprobs` and `meta_info.weight_version`
  out. It plays a Search-R1 agent: it searches first, then answers once the context holds
  retrieved passages, so a real `kart rollout serve` makes real tool calls against a real
  retriever.
- `POST /update_weights_from_disk` `{model_path, weight_version, abort_all_requests, ...}`:
  checks that `model_path` is a Hugging Face folder (config.json and safetensors) and reads its
  shards, aborts the
  requests in flight when `abort_all_requests` (they answer with what they generated so far and
  `finish_reason.type: abort`), then takes `weight_version` as the server's version; answers
  `{success, message, num_paused_requests}` (400 with `success: false` on failure, as SGLang
  does).
- `GET /get_server_info` (`tp_size`, `weight_version`), `POST /init_weights_update_group`
  `{master_address, master_port, rank_offset, world_size, group_name, backend}`,
  `POST /update_weights_from_distributed` `{names, dtypes, shapes, group_name, flush_cache,
  abort_all_requests, weight_version, load_format: "flattened_bucket"}` and
  `POST /destroy_weights_update_group` `{group_name}`: the server's `--tp` workers (processes,
  as SGLang's schedulers are) join the trainer's group with `torch.distributed` exactly as
  SGLang's workers do (`init_custom_process_group` below: a `tcp://` rendezvous, the store under
  the group's name, `_new_process_group_helper`; worker i is rank `rank_offset + i`) and receive
  each bucket with one `torch.distributed.broadcast` of its bytes, as
  `_update_bucketed_weights_from_distributed` does. With `--save DIR`, a worker writes the
  tensors it holds once a bucket brings a `weight_version` to DIR/v{version}-tp{i}.safetensors.
- `GET /get_weight_version`, `GET /health`, and `GET /in_flight` (a stand-in's own: the most
  tokens a request in flight has generated so far, so a test can update mid-generation).
- LoRA adapters, as SGLang's `--enable-lora` server has them (http_server.py, io_struct.py,
  lora_registry.py): `POST /load_lora_adapter {lora_name, lora_path, pinned}` checks that
  `lora_path` is a PEFT folder (adapter_config.json with `peft_type: LORA`, and
  adapter_model.safetensors, which it reads) and answers `{success, error_message,
  loaded_adapters}` (400 with `success: false` for a name already loaded or a bad folder, as
  SGLang does); `POST /unload_lora_adapter {lora_name}` waits for the requests using the adapter
  and removes it (400 for a name not loaded); `POST /update_weight_version {new_version,
  abort_all_requests}` sets the version (aborting the requests in flight when asked); `GET
  /v1/models` lists the served model and a card per adapter (`id`, `root`, `parent`); a
  `/generate` naming an adapter that is not loaded by its `lora_path` gets SGLang's 400. Each
  load, unload and version update is recorded ({lora_load: name, lora_path}, {lora_unload: name},
  {version_update: version, abort_all_requests}), and each generation that names an adapter
  ({generated_by: name}).

Usage: sglang.py MODEL_DIR PORT [--record FILE] [--fail-updates N] [--token-seconds S] [--tp N]
                   [--save DIR] [--group-timeout S]
  --record FILE      append each accepted update to FILE as a JSON line (from disk: {model_path,
                     weight_version, abort_all_requests}; broadcast: {group_name, names,
                     weight_version, abort_all_requests}; a group joined: {joined: group_name, master_address,
                     ranks}), and each aborted request as {aborted: tokens generated}
  --fail-updates N   answer the first N updates with a failure (an unreadable folder, a
                     broadcast not joined)
  --token-seconds S  generate one token every S seconds (default 0: at once)
  --tp N             tensor-parallel workers (default 1)
  --save DIR         where the workers write the weights they received
  --group-timeout S  the workers' collective timeout (SGLang's default is 30 minutes)
"""

import argparse
import json
import multiprocessing
import os
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
import torch.distributed
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

parser = argparse.ArgumentParser()
parser.add_argument("model_dir")
parser.add_argument("port", type=int)
parser.add_argument("--record")
parser.add_argument("--fail-updates", type=int, default=0)
parser.add_argument("--token-seconds", type=float, default=0.0)
parser.add_argument("--tp", type=int, default=1)
parser.add_argument("--save")
parser.add_argument("--group-timeout", type=float, default=1800.0)
args = parser.parse_args()

tokenizer = Tokenizer.from_file(f"{args.model_dir}/tokenizer.json")
state = {"weight_version": "default", "failures_left": args.fail_updates, "aborts": 0}
# LoRA adapters loaded: name -> path, and the requests using each.
adapters: dict[str, str] = {}
adapter_users: dict[str, int] = {}
served_name = os.path.basename(os.path.normpath(args.model_dir))
# Tokens generated so far by each request in flight.
in_flight: dict[int, int] = {}
lock = threading.Lock()


def record(entry: dict) -> None:
    if args.record:
        with open(args.record, "a") as out:
            out.write(json.dumps(entry) + "\n")


def reply(input_ids: list[int]) -> str:
    context = tokenizer.decode(input_ids, skip_special_tokens=False)
    if "Doc 1(Title:" in context:
        return "<answer>William Shakespeare</answer>"
    return "<search>who wrote hamlet</search>"


def continued(input_ids: list[int], reply_ids: list[int]) -> int:
    """How many of `reply_ids` already end `input_ids` (a request continued after an abort)."""
    for n in range(len(reply_ids), 0, -1):
        if input_ids[-n:] == reply_ids[:n]:
            return n
    return 0


def update_from_disk(body: dict) -> tuple[int, dict]:
    path = body["model_path"]
    with lock:
        if state["failures_left"] > 0:
            state["failures_left"] -= 1
            return 400, {"success": False, "message": f"Failed to load {path}: injected failure"}
        files = os.listdir(path) if os.path.isdir(path) else []
        if "config.json" not in files or not any(f.endswith(".safetensors") for f in files):
            return 400, {"success": False, "message": f"{path} is not a Hugging Face model folder"}
        # Read every shard, as SGLang's loader does (what `kart bench sync` times).
        for shard in sorted(f for f in files if f.endswith(".safetensors")):
            load_file(os.path.join(path, shard))
        if body.get("abort_all_requests"):
            state["aborts"] += 1
        if body.get("weight_version") is not None:
            state["weight_version"] = body["weight_version"]
        abort_all = bool(body.get("abort_all_requests"))
        record({"model_path": path, "weight_version": body.get("weight_version"), "abort_all_requests": abort_all})
    return 200, {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}


def lora_update(path: str, body: dict) -> tuple[int, dict]:
    """The LoRA routes and the version update, as SGLang answers them."""
    name = body.get("lora_name")

    def failed(message: str) -> tuple[int, dict]:
        return 400, {"success": False, "error_message": message, "loaded_adapters": dict(adapters)}

    if path == "/update_weight_version":
        with lock:
            if body.get("abort_all_requests"):
                state["aborts"] += 1
            state["weight_version"] = body["new_version"]
            record({"version_update": body["new_version"], "abort_all_requests": bool(body.get("abort_all_requests"))})
        return 200, {"success": True, "message": f"Weight version updated to {body['new_version']}",
                     "new_version": body["new_version"]}
    if path == "/load_lora_adapter":
        folder = body.get("lora_path", "")
        with lock:
            if name in adapters:
                return failed(f"Failed to load LoRA adapter {name} because it is already loaded")
            try:
                with open(os.path.join(folder, "adapter_config.json")) as f:
                    config = json.load(f)
                assert config.get("peft_type") == "LORA", f"peft_type {config.get('peft_type')}"
                load_file(os.path.join(folder, "adapter_model.safetensors"))
            except Exception as e:  # noqa: BLE001 - SGLang reports any failure of the load
                return failed(f"Failed to load LoRA adapter {name} from {folder}: {e}")
            adapters[name] = folder
            adapter_users.setdefault(name, 0)
            record({"lora_load": name, "lora_path": folder})
        return 200, {"success": True, "error_message": None, "loaded_adapters": dict(adapters)}
    # /unload_lora_adapter: new requests for it fail at once; those running finish first.
    with lock:
        if name not in adapters:
            return failed(f"LoRA with name {name} does not exist. Loaded LoRAs: {list(adapters)}")
        del adapters[name]
    while adapter_users.get(name, 0) > 0:
        time.sleep(0.01)
    record({"lora_unload": name})
    return 200, {"success": True, "error_message": None, "loaded_adapters": dict(adapters)}


def init_custom_process_group(backend, init_method, timeout, world_size, rank, group_name):
    """SGLang's `init_custom_process_group` (python/sglang/srt/utils), the calls its workers make."""
    from torch.distributed.distributed_c10d import (
        Backend,
        PrefixStore,
        _new_process_group_helper,
        _world,
        rendezvous,
    )

    backend = Backend(backend)
    store, rank, world_size = next(rendezvous(init_method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    # A PrefixStore keeps the group's keys apart from other users of the store.
    store = PrefixStore(group_name, store)
    pg, _ = _new_process_group_helper(
        world_size, rank, [], backend, store, group_name=group_name, backend_options=None, timeout=timeout
    )
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def worker(tp_rank: int, conn, inherited: list) -> None:
    """One tensor-parallel worker: joins groups, receives buckets, holds the weights. It ends
    with the server (its pipe's other end closes)."""
    for other in inherited:
        other.close()
    groups, held = {}, {}
    while True:
        try:
            op, body = conn.recv()
        except EOFError:
            return
        try:
            if op == "init":
                name = body["group_name"]
                groups[name] = init_custom_process_group(
                    body["backend"],
                    f"tcp://{body['master_address']}:{body['master_port']}",
                    timedelta(seconds=args.group_timeout),
                    body["world_size"],
                    body["rank_offset"] + tp_rank,
                    name,
                )
                conn.send((True, f"joined {name} as rank {body['rank_offset'] + tp_rank}"))
            elif op == "update":
                # SGLang's _update_bucketed_weights_from_distributed with its FlattenedTensorBucket:
                # the tensors' bytes, one after another, in one uint8 tensor.
                named = [
                    (n, torch.empty(s, dtype=getattr(torch, d)))
                    for n, d, s in zip(body["names"], body["dtypes"], body["shapes"])
                ]
                flat = torch.cat([t.flatten().view(torch.uint8) for _, t in named])
                torch.distributed.broadcast(flat, src=0, group=groups[body["group_name"]])
                start = 0
                for n, t in named:
                    size = t.numel() * t.element_size()
                    held[n] = flat[start : start + size].view(t.dtype).reshape(t.shape).clone()
                    start += size
                version = body.get("weight_version")
                if version is not None and args.save:
                    save_file(held, os.path.join(args.save, f"v{version}-tp{tp_rank}.safetensors"))
                conn.send((True, "Succeeded to update parameter online."))
            elif op == "destroy":
                torch.distributed.destroy_process_group(groups.pop(body["group_name"]))
                conn.send((True, "destroyed"))
        except Exception as e:  # answered as SGLang answers: success false, the message
            conn.send((False, f"{type(e).__name__}: {e}"))


def on_workers(op: str, body: dict) -> tuple[bool, str]:
    """Runs `op` on every worker at once, as SGLang's tokenizer manager fans a request out."""
    with control:
        for conn in workers:
            conn.send((op, body))
        answers = [conn.recv() for conn in workers]
    failed = [message for ok, message in answers if not ok]
    return (not failed, "; ".join(failed) or answers[0][1])


def control_op(path: str, body: dict) -> tuple[int, dict]:
    if path == "/init_weights_update_group":
        ok, message = on_workers("init", body)
        if ok:
            ranks = [body["rank_offset"] + i for i in range(args.tp)]
            record({"joined": body["group_name"], "ranks": ranks, "world_size": body["world_size"],
                    "master_address": body["master_address"], "master_port": body["master_port"]})
    elif path == "/destroy_weights_update_group":
        ok, message = on_workers("destroy", body)
    else:
        with lock:
            if state["failures_left"] > 0:
                state["failures_left"] -= 1
                return 400, {"success": False, "message": "Failed to update parameter online: injected failure"}
        if body.get("load_format") != "flattened_bucket":
            return 400, {"success": False, "message": "the stand-in receives flattened buckets only"}
        if body.get("abort_all_requests"):
            with lock:
                state["aborts"] += 1
        ok, message = on_workers("update", body)
        if ok:
            with lock:
                if body.get("weight_version") is not None:
                    state["weight_version"] = body["weight_version"]
            entry = {k: body.get(k) for k in ("group_name", "names", "weight_version", "abort_all_requests")}
            record(entry)
    return (200 if ok else 400), {"success": ok, "message": message}


CONTROL = ("/init_weights_update_group", "/update_weights_from_distributed", "/destroy_weights_update_group")


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/health":
            return self.send(200, {"status": "ok"})
        if self.path == "/get_server_info":
            return self.send(200, {"tp_size": args.tp, "weight_version": state["weight_version"]})
        if self.path == "/get_weight_version":
            return self.send(200, {"weight_version": state["weight_version"]})
        if self.path == "/in_flight":
            return self.send(200, {"tokens": max(in_flight.values(), default=0)})
        if self.path == "/v1/models":
            cards = [{"id": served_name, "object": "model", "root": args.model_dir, "parent": None}]
            cards += [{"id": n, "object": "model", "root": p, "parent": served_name} for n, p in adapters.items()]
            return self.send(200, {"object": "list", "data": cards})
        self.send(404, {"error": "not found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/update_weights_from_disk":
            return self.send(*update_from_disk(body))
        if self.path in CONTROL:
            return self.send(*control_op(self.path, body))
        if self.path in ("/load_lora_adapter", "/unload_lora_adapter", "/update_weight_version"):
            return self.send(*lora_update(self.path, body))
        if self.path != "/generate":
            return self.send(404, {"error": "not found"})
        adapter = body.get("lora_path")
        if adapter is not None:
            with lock:
                if adapter not in adapters:
                    message = f"The following requested LoRA adapters are not loaded: {adapter}\nLoaded adapters: {list(adapters)}"
                    return self.send(400, {"error": {"message": message}})
                adapter_users[adapter] = adapter_users.get(adapter, 0) + 1
            record({"generated_by": adapter})
        try:
            self.generate(body)
        finally:
            if adapter is not None:
                with lock:
                    adapter_users[adapter] -= 1

    def generate(self, body: dict) -> None:
        # The whole reply for the context before any generated tokens: a continued request carries
        # the tokens generated so far, which the reply goes on from.
        text = reply(body["input_ids"])
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        done = continued(body["input_ids"], ids)
        ids = ids[done:]
        version, aborts = state["weight_version"], state["aborts"]
        finish = {"type": "stop", "matched": text[text.rindex("</") :]}
        key = threading.get_ident()
        for n in range(len(ids)):
            in_flight[key] = n
            time.sleep(args.token_seconds)
            if state["aborts"] != aborts:
                ids = ids[:n]
                finish = {"type": "abort", "message": "Abort in running batch", "status_code": 200}
                record({"aborted": n})
                break
        in_flight.pop(key, None)
        self.send(
            200,
            {
                "text": tokenizer.decode(ids),
                "output_ids": ids,
                "meta_info": {
                    "finish_reason": finish,
                    "prompt_tokens": len(body["input_ids"]),
                    "completion_tokens": len(ids),
                    "weight_version": version,
                    "output_token_logprobs": [[-0.5, i, None] for i in ids],
                },
            },
        )

    def send(self, code: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


# The workers start before any thread does (a fork copies only the thread that forks).
context = multiprocessing.get_context("fork")
workers = []
for tp_rank in range(args.tp):
    parent, child = context.Pipe()
    context.Process(target=worker, args=(tp_rank, child, workers + [parent]), daemon=True).start()
    child.close()
    workers.append(parent)
control = threading.Lock()
ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()
