"""The anchor of `kart bench retriever --dense`: faiss's HNSW, or its IVF-PQ, over the same embeddings.

Reads the embeddings and queries kart wrote (little-endian f32 rows), builds faiss's HNSW graph
with the settings kart's graph used (M, efConstruction, inner product, vectors stored as f32, f16
or 8-bit like kart's), or with `--ivfpq LISTS` an IVF-PQ index (LISTS k-means lists, `--pq-bytes`
sub-quantisers of 8 bits, inner product), the candidates re-scored against the f32 vectors by
`IndexRefineFlat` as kart re-scores them. For every `--rerank` depth and every `--ef-search` value
(efSearch, or nprobe for IVF-PQ) it times single queries one at a time on one thread and batches
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
    p.add_argument("--m", type=int, help="HNSW links per node")
    p.add_argument("--ef-construction", type=int)
    p.add_argument("--ef-search", required=True, help="efSearch (nprobe with --ivfpq), comma-separated, each measured")
    p.add_argument("--quantization", choices=["f32", "f16", "i8"])
    p.add_argument("--ivfpq", type=int, help="IVF-PQ with this many lists instead of HNSW")
    p.add_argument("--pq-bytes", type=int, help="IVF-PQ sub-quantisers of 8 bits")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--single", type=int, required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--rerank", required=True, help="candidates re-scored exactly, comma-separated, each measured")
    p.add_argument("--json", required=True)
    a = p.parse_args()

    faiss.omp_set_num_threads(a.threads)
    x = np.fromfile(a.embeddings, dtype="<f4").reshape(-1, a.dim)
    q = np.fromfile(a.queries, dtype="<f4").reshape(-1, a.dim)
    truth = [list(map(int, line.split())) for line in open(a.truth)]

    if a.ivfpq:
        base = faiss.index_factory(a.dim, f"IVF{a.ivfpq},PQ{a.pq_bytes}x8", faiss.METRIC_INNER_PRODUCT)
        # faiss asks for at least 39 training points a list; 64 a list, as its guidelines suggest.
        train_rows = min(len(x), 64 * a.ivfpq)
    elif a.quantization == "f32":
        base = faiss.IndexHNSWFlat(a.dim, a.m, faiss.METRIC_INNER_PRODUCT)
        train_rows = 0
    else:
        kind = faiss.ScalarQuantizer.QT_fp16 if a.quantization == "f16" else faiss.ScalarQuantizer.QT_8bit
        base = faiss.IndexHNSWSQ(a.dim, kind, a.m, faiss.METRIC_INNER_PRODUCT)
        train_rows = 100_000
    if not a.ivfpq:
        base.hnsw.efConstruction = a.ef_construction
    # faiss's own re-scoring of the candidates against the vectors as f32, as kart re-scores them.
    index = faiss.IndexRefineFlat(base)
    print(f"faiss {faiss.__version__}: building {type(base).__name__} over {len(x)} vectors", file=sys.stderr)
    started = time.perf_counter()
    if not index.is_trained:
        rows = np.random.default_rng(0).choice(len(x), size=min(len(x), max(train_rows, 1)), replace=False)
        index.train(x[np.sort(rows)])
    index.add(x)
    build_secs = time.perf_counter() - started
    path = a.json + ".faiss"
    faiss.write_index(base, path)
    index_bytes = os.path.getsize(path)
    os.remove(path)
    searches = []
    index.search(q[: a.batch], a.k)  # warm-up
    settings = [(r, ef) for r in map(int, a.rerank.split(",")) for ef in map(int, a.ef_search.split(","))]
    for rerank, ef in settings:
        index.k_factor = max(1.0, rerank / a.k)
        if a.ivfpq:
            faiss.extract_index_ivf(base).nprobe = ef
        else:
            base.hnsw.efSearch = ef
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
        searches.append({"expansion_search": ef, "rerank": rerank, "single_qps": single_qps, "batch_qps": batch_qps, "recall": recall})
    json.dump(
        {"version": faiss.__version__, "build_secs": build_secs, "index_bytes": index_bytes, "searches": searches},
        open(a.json, "w"),
    )


if __name__ == "__main__":
    main()
