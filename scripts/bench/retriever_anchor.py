#!/usr/bin/env python3
"""The anchor of `kart bench retriever`: bm25s on the corpus and queries kart wrote.

Scores as kart's tantivy index does (Lucene BM25, k1=1.2, b=0.75), with the same stop words
(Lucene's English list) and a Snowball English stemmer, on bm25s's fastest backend (numba).
Measures, like kart:
- index: reading the corpus JSON lines, tokenising and indexing (passages/s);
- single: one query at a time (tokenise + retrieve + fetch the documents), QPS and p50/p99
  latency, with `n_threads=1`: bm25s's best for one query (with `n_threads=-1` every call wakes
  numba's thread pool, which makes single queries many times slower);
- concurrent: single queries from one client thread per core, QPS (bm25s's serial numba kernel
  releases the GIL, so the threads score in parallel);
- batch: batches of `--batch` queries on all cores (`n_threads=-1`), QPS;
- recall@k: how often the query's known answer passage is among the top k.
Writes one JSON object to `--json`.
"""

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version

import bm25s
import numpy as np
import Stemmer

# Lucene's English stop words, as tantivy's `StopWordFilter::new(Language::English)`.
STOPWORDS = [
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it", "no",
    "not", "of", "on", "or", "such", "that", "the", "their", "then", "there", "these", "they", "this",
    "to", "was", "will", "with",
]  # fmt: skip


def log(message):
    print(f"[anchor] {message}", file=sys.stderr, flush=True)


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", required=True, help="Search-R1 corpus: {id, contents} JSON lines")
    parser.add_argument("--queries", required=True, help="{query, answer} JSON lines, answer = a corpus id")
    parser.add_argument("--topk", type=int, default=3)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--json", required=True, help="where to write the results")
    args = parser.parse_args()

    stemmer = Stemmer.Stemmer("english")

    def tokenize(texts):
        return bm25s.tokenize(texts, stopwords=STOPWORDS, stemmer=stemmer, show_progress=False)

    started = time.perf_counter()
    rows = read_jsonl(args.corpus)
    ids = [str(row["id"]) for row in rows]
    contents = [row["contents"] for row in rows]
    del rows
    retriever = bm25s.BM25(k1=1.2, b=0.75, method="lucene", backend="numba")
    retriever.index(tokenize(contents), show_progress=False)
    index_seconds = time.perf_counter() - started
    log(f"indexed {len(contents)} passages in {index_seconds:.1f}s")

    queries = read_jsonl(args.queries)
    texts = [q["query"] for q in queries]
    k = args.topk

    def search(batch, n_threads):
        """The top-k corpus rows of each query, and their documents."""
        rows, _scores = retriever.retrieve(tokenize(batch), k=k, n_threads=n_threads, show_progress=False)
        return rows, [[(ids[i], contents[i]) for i in top] for top in rows]

    # Warm-up: compiles the numba kernels (serial and parallel) and touches the whole index.
    search(texts[:1], n_threads=1)
    for start in range(0, len(texts), args.batch):
        search(texts[start : start + args.batch], n_threads=-1)

    latencies = []
    top_rows = []
    for text in texts:
        began = time.perf_counter()
        rows, _docs = search([text], n_threads=1)
        latencies.append(time.perf_counter() - began)
        top_rows.append(rows[0])
    single_seconds = sum(latencies)

    began = time.perf_counter()
    with ThreadPoolExecutor(max_workers=os.cpu_count()) as clients:
        list(clients.map(lambda text: search([text], n_threads=1), texts))
    concurrent_seconds = time.perf_counter() - began

    began = time.perf_counter()
    for start in range(0, len(texts), args.batch):
        search(texts[start : start + args.batch], n_threads=-1)
    batch_seconds = time.perf_counter() - began

    hits = sum(q["answer"] in {ids[i] for i in top} for q, top in zip(queries, top_rows))
    latencies_ms = np.array(latencies) * 1e3
    result = {
        "anchor": f"bm25s {version('bm25s')}, numba {version('numba')} backend, {os.cpu_count()} cores",
        "passages": len(contents),
        "queries": len(texts),
        "index_seconds": index_seconds,
        "index_passages_per_second": len(contents) / index_seconds,
        "single_qps": len(texts) / single_seconds,
        "single_p50_ms": float(np.percentile(latencies_ms, 50)),
        "single_p99_ms": float(np.percentile(latencies_ms, 99)),
        "concurrent_qps": len(texts) / concurrent_seconds,
        "batch_qps": len(texts) / batch_seconds,
        "recall": hits / len(queries),
    }
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    log(json.dumps(result))


if __name__ == "__main__":
    main()
