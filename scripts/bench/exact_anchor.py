"""The exact-scan anchor of `kart bench retriever --dense`: the same embeddings searched with a plain
torch matrix product and `topk`, as a PyTorch user would write a flat inner-product index.

Usage: exact_anchor.py --embeddings F --queries F --truth F --dim D --k K --batch B --single N
                       --threads T --device cpu|cuda --json OUT

The embeddings and queries are the bench's little-endian f32 rows. On the CPU the scan is f32; on
CUDA the embeddings are f16 on the first GPU, as kart's flat index holds them there. Timed as kart
times its own scan: batches of B queries on T threads, then N single queries one at a time on one
thread (each timed to the end of the GPU's work). Writes {"on", "batch_qps", "single_qps",
"recall"}, recall@K being the share of kart's exact top K (the truth file, one line of ids per
query) this scan returns too (below 1 only where f16 rounding reorders near ties).
"""

import argparse
import json
import time

import numpy as np
import torch


def main():
    parser = argparse.ArgumentParser()
    for flag in ["--embeddings", "--queries", "--truth", "--device", "--json"]:
        parser.add_argument(flag, required=True)
    for flag in ["--dim", "--k", "--batch", "--single", "--threads"]:
        parser.add_argument(flag, type=int, required=True)
    args = parser.parse_args()
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    kind = torch.float16 if device.type == "cuda" else torch.float32
    torch.set_num_threads(args.threads)

    rows = torch.from_numpy(np.fromfile(args.embeddings, dtype="<f4").reshape(-1, args.dim))
    index = rows.to(device=device, dtype=kind)
    del rows
    queries = torch.from_numpy(np.fromfile(args.queries, dtype="<f4").reshape(-1, args.dim)).to(device=device, dtype=kind)
    truth = [set(map(int, line.split())) for line in open(args.truth)]

    def search(batch):
        return torch.topk((batch @ index.T).float(), args.k, dim=1).indices

    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    with torch.inference_mode():
        search(queries[:1])  # warm-up
        synchronize()
        found = []
        start = time.perf_counter()
        for i in range(0, len(queries), args.batch):
            found.append(search(queries[i : i + args.batch]).cpu())
        synchronize()
        batch_qps = len(queries) / (time.perf_counter() - start)
        torch.set_num_threads(1)
        single = min(args.single, len(queries))
        start = time.perf_counter()
        for i in range(single):
            search(queries[i : i + 1]).cpu()
        synchronize()
        single_qps = single / (time.perf_counter() - start)

    ids = torch.cat(found).tolist()
    hits = sum(len(truth[q] & set(ids[q])) for q in range(len(ids)))
    report = {
        "on": f"{device} {str(kind).removeprefix('torch.')}",
        "batch_qps": batch_qps,
        "single_qps": single_qps,
        "recall": hits / (len(ids) * args.k),
    }
    with open(args.json, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
