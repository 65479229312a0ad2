"""A stand-in for a vLLM server (`VLLM_SERVER_DEV_MODE=1`, `--weight-transfer-config
'{"backend": "nccl"}'`) that speaks the endpoints kart uses, as vLLM 0.32 defines them
(vllm/entrypoints/openai and vllm/entrypoints/serve/dev/rlhf/api_router.py):

- `POST /v1/completions`: a prompt of token ids in, `choices[0].logprobs` with `token_id:{id}`
  tokens out. It plays a Search-R1 agent, as scripts/standins/sglang.py does: it searches first,
  then answers once the context holds retrieved passages. A request for another `model` than the
  served one gets vLLM's 404.
- `POST /pause?mode=wait`: waits for the requests in flight, then holds new ones until
  `POST /resume`; `GET /is_paused`.
- `GET /get_world_size` (`--tp` workers), `GET /weight_info` (`weight_version`, null until the
  first update finished).
- `POST /init_weight_transfer_engine {init_info: {master_address, master_port, rank_offset,
  world_size}}`: the workers (processes, as vLLM's are) join the trainer's group as worker i =
  rank `rank_offset + i`. vLLM's NCCL engine opens a `PyNcclCommunicator` over a
  `StatelessProcessGroup`, which needs GPUs; on the CPU the stand-in's workers join the way
  vLLM's `torch.distributed` transport does for platforms without NCCL
  (`stateless_init_torch_distributed_process_group` below: a `tcp://` rendezvous on the trainer's
  store, a Gloo group on its keys under `tcp://host:port`).
- `POST /start_weight_update`, `POST /update_weights {update_info: {names, dtype_names, shapes,
  packed: false}}` (each tensor received with one broadcast from rank 0, then a barrier, as the
  transport does), `POST /finish_weight_update {weight_version}`. With `--save DIR`, a worker
  writes the tensors it holds at the finish to DIR/v{version}-tp{i}.safetensors.
- `GET /health`.

Usage: vllm.py MODEL_DIR PORT [--record FILE] [--fail-updates N] [--tp N] [--save DIR]
                 [--group-timeout S] [--served-model-name NAME]
  --record FILE      append each call of the update routes to FILE as a JSON line ({call, ...})
  --fail-updates N   answer the first N `/update_weights` with a failure (the broadcast not joined)
  --served-model-name NAME   the name requests must give as `model` (default: MODEL_DIR's folder name)
"""

import argparse
import json
import multiprocessing
import os
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer

parser = argparse.ArgumentParser()
parser.add_argument("model_dir")
parser.add_argument("port", type=int)
parser.add_argument("--record")
parser.add_argument("--fail-updates", type=int, default=0)
parser.add_argument("--tp", type=int, default=1)
parser.add_argument("--save")
parser.add_argument("--group-timeout", type=float, default=300.0)
parser.add_argument("--served-model-name")
args = parser.parse_args()
# vLLM serves the model under --served-model-name, else under the path it was given; the stand-in
# defaults to the folder's name, which the tests configure.
served = args.served_model_name or os.path.basename(os.path.normpath(args.model_dir))

tokenizer = Tokenizer.from_file(f"{args.model_dir}/tokenizer.json")
state = {"weight_version": None, "failures_left": args.fail_updates, "paused": False, "in_flight": 0}
changed = threading.Condition()


def record(entry: dict) -> None:
    if args.record:
        with open(args.record, "a") as out:
            out.write(json.dumps(entry) + "\n")


def reply(prompt: list[int]) -> str:
    context = tokenizer.decode(prompt, skip_special_tokens=False)
    if "Doc 1(Title:" in context:
        return "<answer>William Shakespeare</answer>"
    return "<search>who wrote hamlet</search>"


def stateless_init_torch_distributed_process_group(host, port, rank, world_size, timeout):
    """vLLM's `stateless_init_torch_distributed_process_group` (vllm/distributed/utils.py) with
    the Gloo backend: a group outside torch.distributed's global state."""
    from torch.distributed import PrefixStore, ProcessGroup
    from torch.distributed.distributed_c10d import ProcessGroupGloo
    from torch.distributed.rendezvous import rendezvous

    init_method = f"tcp://{host}:{port}"
    store, rank, world_size = next(rendezvous(init_method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    prefix_store = PrefixStore(init_method, store)
    pg = ProcessGroup(prefix_store, rank, world_size)
    backend = ProcessGroupGloo(prefix_store, rank, world_size, timeout=timeout)
    pg._set_default_backend(ProcessGroup.BackendType.GLOO)
    backend._set_sequence_number_for_group()
    pg._register_backend(torch.device("cpu"), ProcessGroup.BackendType.GLOO, backend)
    return pg


def worker(tp_rank: int, conn, inherited: list) -> None:
    """One worker: joins the trainer's group, receives tensors, holds them. It ends with the
    server (its pipe's other end closes)."""
    for other in inherited:
        other.close()
    group, held = None, {}
    while True:
        try:
            op, body = conn.recv()
        except EOFError:
            return
        try:
            if op == "init":
                info = body["init_info"]
                rank = info["rank_offset"] + tp_rank
                group = stateless_init_torch_distributed_process_group(
                    info["master_address"], info["master_port"], rank, info["world_size"],
                    timedelta(seconds=args.group_timeout),
                )
                conn.send((True, f"joined as rank {rank}"))
            elif op == "update":
                # NCCLWeightTransferEngine.receive_weights, unpacked: one broadcast per tensor.
                info = body["update_info"]
                for name, dtype, shape in zip(info["names"], info["dtype_names"], info["shapes"]):
                    weight = torch.empty(shape, dtype=getattr(torch, dtype))
                    group.broadcast(weight, 0).wait()
                    group.barrier().wait()
                    held[name] = weight
                conn.send((True, "Weights updated"))
            elif op == "finish":
                if args.save:
                    save_file(held, os.path.join(args.save, f"v{body['weight_version']}-tp{tp_rank}.safetensors"))
                conn.send((True, "Weight update finished"))
        except Exception as e:
            conn.send((False, f"{type(e).__name__}: {e}"))


def on_workers(op: str, body: dict) -> tuple[bool, str]:
    """Runs `op` on every worker at once, as vLLM's collective RPC does."""
    with control:
        for conn in workers:
            conn.send((op, body))
        answers = [conn.recv() for conn in workers]
    failed = [message for ok, message in answers if not ok]
    return (not failed, "; ".join(failed) or answers[0][1])


def update_route(path: str, query: dict, body: dict) -> tuple[int, dict]:
    if path == "/pause":
        mode = query.get("mode", ["abort"])[0]
        with changed:
            state["paused"] = True
            if mode == "wait":
                changed.wait_for(lambda: state["in_flight"] == 0)
        record({"call": "pause", "mode": mode})
        return 200, {"status": "paused"}
    if path == "/resume":
        with changed:
            state["paused"] = False
            changed.notify_all()
        record({"call": "resume"})
        return 200, {"status": "resumed"}
    if path == "/init_weight_transfer_engine":
        if "init_info" not in body:
            return 400, {"detail": "Missing 'init_info' in request body"}
        ok, message = on_workers("init", body)
        record({"call": "init", **body["init_info"]})
    elif path == "/start_weight_update":
        ok, message = True, "Weight update started"
        record({"call": "start"})
    elif path == "/update_weights":
        with changed:
            if state["failures_left"] > 0:
                state["failures_left"] -= 1
                return 500, {"detail": "Failed to update weights: injected failure"}
        ok, message = on_workers("update", body)
        record({"call": "update", "names": body["update_info"]["names"]})
    elif path == "/finish_weight_update":
        ok, message = on_workers("finish", body)
        if ok:
            with changed:
                state["weight_version"] = body.get("weight_version")
        record({"call": "finish", "weight_version": body.get("weight_version")})
    else:
        return 404, {"detail": "Not Found"}
    return (200, {"message": message}) if ok else (500, {"detail": message})


def complete(body: dict) -> dict:
    with changed:
        changed.wait_for(lambda: not state["paused"])
        state["in_flight"] += 1
    try:
        text = reply(body["prompt"])
        ids = tokenizer.encode(text, add_special_tokens=False).ids
    finally:
        with changed:
            state["in_flight"] -= 1
            changed.notify_all()
    return {
        "id": "cmpl-standin",
        "object": "text_completion",
        "model": body.get("model"),
        "choices": [{
            "index": 0,
            "text": tokenizer.decode(ids),
            "logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-0.5] * len(ids)},
            "finish_reason": "stop",
        }],
        "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(ids)},
    }


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/health":
            return self.send(200, {})
        if self.path.startswith("/get_world_size"):
            return self.send(200, {"world_size": args.tp})
        if self.path == "/weight_info":
            return self.send(200, {"weight_version": state["weight_version"]})
        if self.path == "/is_paused":
            return self.send(200, {"is_paused": state["paused"]})
        self.send(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        url = urlparse(self.path)
        if url.path == "/v1/completions":
            if body.get("model") != served:
                # As vLLM's OpenAI server answers a model it does not serve.
                message = f"The model `{body.get('model')}` does not exist."
                return self.send(404, {"error": {"message": message, "type": "NotFoundError", "code": 404}})
            return self.send(200, complete(body))
        self.send(*update_route(url.path, parse_qs(url.query), body))

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
