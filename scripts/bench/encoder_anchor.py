"""The anchor of `kart bench encoder`: sentence-transformers on the model folder kart encodes with.

Usage: encoder_anchor.py SPEC OUT. SPEC (JSON, written by kart) is

  {"model": str, "sentences": [str], "batch_size": int, "warmup": int, "embeddings": str}

The anchor loads the model, encodes the first `warmup` sentences and prints `ready`. Then, for each
line kart writes to its stdin, it encodes all the sentences and prints the seconds taken, so that
kart can alternate its runs with the anchor's and both see the same machine load. At the end of
stdin it writes the last run's embeddings to `embeddings` (N x D little-endian f32, for kart's
parity check) and {"threads": int, "torch": str, "sentence_transformers": str} to OUT.

A run is one `SentenceTransformer.encode` of all the sentences (it sorts them by length and batches
them), on the CPU with torch's default number of threads.
"""

import json
import sys
import time

import sentence_transformers
import torch
from sentence_transformers import SentenceTransformer


def main(spec_path, out_path):
    with open(spec_path) as f:
        spec = json.load(f)
    model = SentenceTransformer(spec["model"], device="cpu")
    sentences, batch_size = spec["sentences"], spec["batch_size"]

    def encode(texts):
        return model.encode(texts, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)

    embeddings = encode(sentences[: spec["warmup"]])
    print("ready", flush=True)
    while sys.stdin.readline():
        start = time.perf_counter()
        embeddings = encode(sentences)
        print(time.perf_counter() - start, flush=True)
    embeddings.astype("<f4").tofile(spec["embeddings"])
    out = {
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "sentence_transformers": sentence_transformers.__version__,
    }
    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
