"""The anchor of `kart bench retriever --dense`: faiss's HNSW over the same embeddings.

Reads the embeddings and queries kart wrote (little-endian f32 rows), builds faiss's HNSW graph
with the settings kart's graph used (M, efConstruction, efSearch, inner product, vectors stored as
f32, f16 or 8-bit like kart's, the candidates re-scored against the f32 vectors as kart re-scores
them), then times single queries one at a time on one thread and batches
on every core, and measures recall@k against the exact neighbours kart computed (one line of row
ids per query). Prints nothing but progress on stderr; writes its figures to --json.
"""

import argparse
import json
import os
import sys
import time

import faiss
import numpy as np


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--embeddings", required=True)
    p.add_argument("--queries", required=True)
    p.add_argument("--truth", required=True)
    p.add_argument("--dim", type=int, required=True)
    p.add_argument("--k", type=int, required=True)
    p.add_argument("--m", type=int, required=True)
    p.add_argument("--ef-construction", type=int, required=True)
    p.add_argument("--ef-search", required=True, help="comma-separated values, each measured")
    p.add_argument("--quantization", choices=["f32", "f16", "i8"], required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--single", type=int, required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--rerank", type=int, required=True, help="candidates re-scored exactly")
    p.add_argument("--json", required=True)
    a = p.parse_args()

    faiss.omp_set_num_threads(a.threads)
    x = np.fromfile(a.embeddings, dtype="<f4").reshape(-1, a.dim)
    q = np.fromfile(a.queries, dtype="<f4").reshape(-1, a.dim)
    truth = [list(map(int, line.split())) for line in open(a.truth)]

    if a.quantization == "f32":
        index = faiss.IndexHNSWFlat(a.dim, a.m, faiss.METRIC_INNER_PRODUCT)
    else:
        kind = faiss.ScalarQuantizer.QT_fp16 if a.quantization == "f16" else faiss.ScalarQuantizer.QT_8bit
        index = faiss.IndexHNSWSQ(a.dim, kind, a.m, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = a.ef_construction
    hnsw = index
    # faiss's own re-scoring of the candidates against the vectors as f32, as kart re-scores them.
    index = faiss.IndexRefineFlat(hnsw)
    index.k_factor = max(1.0, a.rerank / a.k)
    print(f"faiss {faiss.__version__}: building {type(index).__name__} over {len(x)} vectors", file=sys.stderr)
    started = time.perf_counter()
    if not index.is_trained:
        index.train(x[: min(len(x), 100_000)])
    index.add(x)
    build_secs = time.perf_counter() - started
    path = a.json + ".faiss"
    faiss.write_index(hnsw, path)
    index_bytes = os.path.getsize(path)
    os.remove(path)
    searches = []
    index.search(q[: a.batch], a.k)  # warm-up
    for ef in map(int, a.ef_search.split(",")):
        hnsw.hnsw.efSearch = ef
        faiss.omp_set_num_threads(a.threads)
        started = time.perf_counter()
        found = []
        for start in range(0, len(q), a.batch):
            _, ids = index.search(q[start : start + a.batch], a.k)
            found.extend(ids.tolist())
        batch_qps = len(q) / (time.perf_counter() - started)
        faiss.omp_set_num_threads(1)
        single = q[: a.single]
        started = time.perf_counter()
        for row in single:
            index.search(row[None, :], a.k)
        single_qps = len(single) / (time.perf_counter() - started)
        hits = sum(len(set(f) & set(t)) for f, t in zip(found, truth))
        recall = hits / sum(len(t) for t in truth)
        searches.append({"expansion_search": ef, "single_qps": single_qps, "batch_qps": batch_qps, "recall": recall})
    json.dump(
        {"version": faiss.__version__, "build_secs": build_secs, "index_bytes": index_bytes, "searches": searches},
        open(a.json, "w"),
    )


if __name__ == "__main__":
    main()
