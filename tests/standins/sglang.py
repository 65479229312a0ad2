"""A stand-in for an SGLang server that speaks the endpoints kart uses, as SGLang's HTTP server
(python/sglang/srt/entrypoints/http_server.py) defines them:

- `POST /generate`: token ids in, `meta_info.output_token_logprobs` and `meta_info.weight_version`
  out. It plays a Search-R1 agent: it searches first, then answers once the context holds
  retrieved passages, so a real `kart rollout serve` makes real tool calls against a real
  retriever.
- `POST /update_weights_from_disk` `{model_path, weight_version, abort_all_requests, ...}`:
  checks that `model_path` is a Hugging Face folder (config.json and safetensors), aborts the
  requests in flight when `abort_all_requests` (they answer with what they generated so far and
  `finish_reason.type: abort`), then takes `weight_version` as the server's version; answers
  `{success, message, num_paused_requests}` (400 with `success: false` on failure, as SGLang
  does).
- `GET /get_weight_version`, `GET /health`, and `GET /in_flight` (a stand-in's own: the most
  tokens a request in flight has generated so far, so a test can update mid-generation).

Usage: sglang.py MODEL_DIR PORT [--record FILE] [--fail-updates N] [--token-seconds S]
  --record FILE      append each accepted update to FILE as a JSON line {model_path,
                     weight_version, abort_all_requests}, and each aborted request as
                     {aborted: tokens generated}
  --fail-updates N   answer the first N updates with a failure (an unreadable folder, say)
  --token-seconds S  generate one token every S seconds (default 0: at once)
"""

import argparse
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tokenizers import Tokenizer

parser = argparse.ArgumentParser()
parser.add_argument("model_dir")
parser.add_argument("port", type=int)
parser.add_argument("--record")
parser.add_argument("--fail-updates", type=int, default=0)
parser.add_argument("--token-seconds", type=float, default=0.0)
args = parser.parse_args()

tokenizer = Tokenizer.from_file(f"{args.model_dir}/tokenizer.json")
state = {"weight_version": "default", "failures_left": args.fail_updates, "aborts": 0}
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
        if body.get("abort_all_requests"):
            state["aborts"] += 1
        if body.get("weight_version") is not None:
            state["weight_version"] = body["weight_version"]
        abort_all = bool(body.get("abort_all_requests"))
        record({"model_path": path, "weight_version": body.get("weight_version"), "abort_all_requests": abort_all})
    return 200, {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/health":
            return self.send(200, {"status": "ok"})
        if self.path == "/get_weight_version":
            return self.send(200, {"weight_version": state["weight_version"]})
        if self.path == "/in_flight":
            return self.send(200, {"tokens": max(in_flight.values(), default=0)})
        self.send(404, {"error": "not found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/update_weights_from_disk":
            return self.send(*update_from_disk(body))
        if self.path != "/generate":
            return self.send(404, {"error": "not found"})
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


ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()
