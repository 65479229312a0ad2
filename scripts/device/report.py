"""The report of `scripts/gpu-check.sh --single-gpu` and `--cpu-rehearsal`: every step's status and
figures from the folder the steps wrote (scripts/device/check-steps.sh), as OUT/gpu-check.json,
the tables as OUT/gpu-check.md, and the steps' logs as OUT/logs.tar.gz.

    python3 report.py --work DIR --out OUT --mode MODE --card CARD --peak TFLOPS --seconds N

Uses the standard library only (it runs with the GPU machine's Python as with this one's).
"""

import argparse
import datetime
import json
import pathlib
import tarfile

STEPS = ["doctor", "model-f32", "model-bf16", "step-gpu", "step-cpu", "train-0.5b", "train-1.5b", "memory",
         "dense", "local"]


def load(work: pathlib.Path, name: str):
    """The JSON a step wrote, or None."""
    path = work / f"{name}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def tail(work: pathlib.Path, name: str, lines: int = 12) -> str:
    """The end of a step's log."""
    try:
        return "\n".join((work / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def fmt(value, spec=".3g"):
    """A figure, or a dash when it is missing."""
    return "-" if value is None else format(value, spec)


def ratio(a, b):
    return None if a is None or not b else a / b


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown(report) -> str:
    r = report["results"]
    out = [f"# kart GPU check: {report['card']} ({report['mode']}), {report['date']}", ""]
    doctor = r.get("doctor") or {}
    devices = ", ".join(f"{d.get('name')} ({d.get('total_memory_bytes', 0) / 2**30:.0f} GiB)"
                        for d in doctor.get("devices", [])) or "none"
    out += [f"PyTorch {doctor.get('torch_version', '?')}; CUDA support loaded: "
            f"{(doctor.get('cuda') or {}).get('loaded')}; devices: {devices}; NCCL: {doctor.get('nccl')}; "
            f"{report['seconds']} s in all.", ""]

    out += ["## Steps", "", table(["step", "status", "seconds"], [
        (s["step"], "skipped" if s.get("skipped") else ("ok" if s["rc"] == 0 else f"failed ({s['rc']})"),
         s["seconds"]) for s in report["steps"]])]
    for s in report["steps"]:
        if s.get("rc") not in (0, None):
            out += ["", f"`{s['step']}` failed; the end of its log:", "", "```", s.get("log_tail", ""), "```"]

    rows = []
    for precision in ["f32", "bf16"]:
        m = r.get(f"model-{precision}")
        if m:
            same = ", ".join(f"{n}/{b} at batch {b}" for b, n in m.get("identical_greedy", []))
            gap = m.get("logits") or {}
            rows.append((precision, fmt(gap.get("max_abs_diff")), fmt(gap.get("argmax_agreement"), ".3f"), same,
                         fmt(m["loss"]["kart"], ".6f"), fmt(m["loss"]["anchor"], ".6f")))
    if rows:
        out += ["", "## Correctness against transformers (same GPU, same weights)", "",
                table(["precision", "logits max abs diff", "argmax agreement", "greedy tokens identical",
                       "loss kart", "loss transformers"], rows)]
    step_gpu, step_cpu = r.get("step-gpu"), r.get("step-cpu")
    if step_gpu and step_cpu:
        first = lambda rep: rep["pairs"][0]["kart"]["steps"][0]  # noqa: E731
        g, c = first(step_gpu), first(step_cpu)
        out += ["", "## One GRPO step on the GPU against the CPU (f32, the fixture's shape)", "",
                table(["figure", "GPU", "CPU", "relative difference"], [
                    (k, fmt(g[k], ".6g"), fmt(c[k], ".6g"),
                     fmt(abs(g[k] - c[k]) / max(abs(c[k]), 1e-12), ".2e")) for k in ["pg_loss", "grad_norm", "entropy"]])]

    rows = []
    for precision in ["f32", "bf16"]:
        for row in (r.get(f"model-{precision}") or {}).get("rows", []):
            if row["metric"].startswith("generate"):
                rows.append((precision, row["metric"], fmt(row["kart"], ".1f"), fmt(row["anchor"], ".1f"),
                             fmt(row["ratio"], ".2f") + "x"))
    if rows:
        out += ["", "## Generation against transformers `generate`", "",
                table(["precision", "metric", "kart", "transformers", "ratio"], rows)]

    rows = []
    for shape in ["0.5b", "1.5b"]:
        t = r.get(f"train-{shape}")
        if t:
            p = t["pairs"][0]
            mfu = p.get("mfu") or {}
            rows.append((t.get("shape", shape), fmt(t["parameters"] / 1e6, ".1f") + "M",
                         fmt(p["tokens_per_second"]["kart"], ".0f"), fmt(p["tokens_per_second"]["torch"], ".0f"),
                         fmt(ratio(p["tokens_per_second"]["kart"], p["tokens_per_second"]["torch"]), ".2f") + "x",
                         fmt(mfu.get("kart") and 100 * mfu["kart"], ".1f") + "%",
                         fmt(mfu.get("torch") and 100 * mfu["torch"], ".1f") + "%"))
    if rows:
        out += ["", f"## GRPO step (policy + reference, bf16, activation checkpointing) against torch; "
                    f"MFU against {report['peak_tflops'] or '?'} TFLOP/s", "",
                table(["shape", "parameters", "tokens/s kart", "tokens/s torch", "ratio", "MFU kart",
                       "MFU torch"], rows)]

    memory = r.get("memory")
    if memory:
        out += ["", "## Memory (`kart bench train --memory --precision bf16`)", "",
                table(["setting", "step (s)", "tokens/s", "peak MiB", "memory ratio"], [
                    (f"{m['setup']['precision']}{' + checkpointing' if m['setup']['activation_checkpointing'] else ''}"
                     f"{'' if m['setup']['sharding'] == 'none' else ' + ' + m['setup']['sharding'] + ' sharding'}, "
                     f"{m['setup']['ranks']} rank(s)", fmt(m["seconds"], ".2f"), fmt(m["tokens_per_second"], ".0f"),
                     fmt(m["peak_bytes_per_rank"] / 2**20, ".0f"), fmt(m["memory_ratio"], ".2f")) for m in memory])]

    dense = r.get("dense")
    if dense:
        torch = dense.get("torch_exact") or {}
        out += ["", f"## Dense exact scan ({dense['passages']} x {dense['dim']}) against torch matmul + topk", "",
                table(["", "kart", "torch", "ratio"], [
                    ("on", dense["exact_on"], torch.get("on", "-"), ""),
                    ("single QPS", fmt(dense["exact_single_qps"], ".1f"), fmt(torch.get("single_qps"), ".1f"),
                     fmt(ratio(dense["exact_single_qps"], torch.get("single_qps")), ".2f") + "x"),
                    ("batched QPS", fmt(dense["exact_batch_qps"], ".1f"), fmt(torch.get("batch_qps"), ".1f"),
                     fmt(ratio(dense["exact_batch_qps"], torch.get("batch_qps")), ".2f") + "x"),
                    ("recall@10 of kart's top 10", "1", fmt(torch.get("recall"), ".4f"), "")])]

    local = r.get("local")
    if local:
        out += ["", "## `kart local --steps 2`", "",
                f"Completed in {local['seconds']:.0f} s; held-out exact match {local['after_warm_start']['exact_match']:.3f} "
                f"after the warm start, {local['after_rl']['exact_match']:.3f} after RL."]
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=pathlib.Path, required=True)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--mode", required=True)
    parser.add_argument("--card", required=True)
    parser.add_argument("--peak", default="")
    parser.add_argument("--seconds", type=int, required=True)
    args = parser.parse_args()

    steps = [json.loads(line) for line in (args.work / "steps.jsonl").read_text().splitlines() if line.strip()]
    for s in steps:
        if s.get("rc") not in (0, None):
            s["log_tail"] = tail(args.work, s["step"])
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "mode": args.mode,
        "card": args.card,
        "peak_tflops": float(args.peak) if args.peak else None,
        "seconds": args.seconds,
        "steps": steps,
        "results": {name: load(args.work, name) for name in STEPS},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu-check.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "gpu-check.md").write_text(markdown(report))
    with tarfile.open(args.out / "logs.tar.gz", "w:gz") as logs:
        for log in sorted(args.work.glob("*.log")):
            logs.add(log, arcname=log.name)
    failed = [s["step"] for s in steps if s.get("rc") != 0]
    print((args.out / "gpu-check.md").read_text())
    print(f"gpu-check: {len(steps) - len(failed)} of {len(steps)} steps ok"
          + (f"; not ok: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
