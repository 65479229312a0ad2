"""A stand-in for an SGLang server that speaks the endpoints kart uses, as SGLang's HTTP server
(python/sglang/srt/entrypoints/http_server.py) defines them:

- `POST /generate`: token ids in, `meta_info.output_token_logprobs` and `meta_info.weight_version`
  out. It plays a Search-R1 agent: it searches first, then answers once the context holds
  retrieved passages, so a real `kart rollout serve` makes real tool calls against a real
  retriever.
- `POST /update_weights_from_disk` `{model_path, weight_version, ...}`: checks that `model_path`
  is a Hugging Face folder (config.json and safetensors), then takes `weight_version` as the
  server's version; answers `{success, message, num_paused_requests}` (400 with `success: false`
  on failure, as SGLang does).
- `GET /get_weight_version`, `GET /health`.

Usage: sglang.py MODEL_DIR PORT [--record FILE] [--fail-updates N]
  --record FILE      append each accepted update to FILE as a JSON line {model_path, weight_version}
  --fail-updates N   answer the first N updates with a failure (an unreadable folder, say)
"""

import argparse
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tokenizers import Tokenizer

parser = argparse.ArgumentParser()
parser.add_argument("model_dir")
parser.add_argument("port", type=int)
parser.add_argument("--record")
parser.add_argument("--fail-updates", type=int, default=0)
args = parser.parse_args()

tokenizer = Tokenizer.from_file(f"{args.model_dir}/tokenizer.json")
state = {"weight_version": "default", "failures_left": args.fail_updates}
lock = threading.Lock()


def reply(input_ids: list[int]) -> str:
    context = tokenizer.decode(input_ids, skip_special_tokens=False)
    if "Doc 1(Title:" in context:
        return "<answer>William Shakespeare</answer>"
    return "<search>who wrote hamlet</search>"


def update_from_disk(body: dict) -> tuple[int, dict]:
    path = body["model_path"]
    with lock:
        if state["failures_left"] > 0:
            state["failures_left"] -= 1
            return 400, {"success": False, "message": f"Failed to load {path}: injected failure"}
        files = os.listdir(path) if os.path.isdir(path) else []
        if "config.json" not in files or not any(f.endswith(".safetensors") for f in files):
            return 400, {"success": False, "message": f"{path} is not a Hugging Face model folder"}
        if body.get("weight_version") is not None:
            state["weight_version"] = body["weight_version"]
        if args.record:
            with open(args.record, "a") as record:
                record.write(json.dumps({"model_path": path, "weight_version": body.get("weight_version")}) + "\n")
    return 200, {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/health":
            return self.send(200, {"status": "ok"})
        if self.path == "/get_weight_version":
            return self.send(200, {"weight_version": state["weight_version"]})
        self.send(404, {"error": "not found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/update_weights_from_disk":
            return self.send(*update_from_disk(body))
        if self.path != "/generate":
            return self.send(404, {"error": "not found"})
        text = reply(body["input_ids"])
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        self.send(
            200,
            {
                "text": text,
                "output_ids": ids,
                "meta_info": {
                    "finish_reason": {"type": "stop", "matched": text[text.rindex("</") :]},
                    "prompt_tokens": len(body["input_ids"]),
                    "completion_tokens": len(ids),
                    "weight_version": state["weight_version"],
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
