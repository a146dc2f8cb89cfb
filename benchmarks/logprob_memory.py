"""Peak memory of the training log-prob pass: full [tokens x vocab] logits vs rllava's chunked LM head.

    python benchmarks/logprob_memory.py [--tokens 4096] [--hidden 2048] [--vocab 151936] [--chunks 1024 256]

What is measured is the part of a policy update that the vocabulary dominates: the LM head, log-softmax,
the sampled tokens' log-probs and the entropy (with its gradient, an entropy bonus), forward *and* backward,
over `--tokens` trained response tokens (default 4096 = e.g. 8 responses x 512 tokens, a realistic micro-batch)
of a Qwen2.5-VL-3B-sized head (hidden 2048, Qwen's 151,936-token vocabulary), in fp32.

Each configuration runs in a fresh process. On a GPU, peak = torch.cuda.max_memory_allocated above what was
allocated before the pass; on a CPU, the growth of the process's peak resident memory (ru_maxrss) over its
resident memory before the pass (allocator caching makes the CPU figure a slight overestimate for both).
The head's own weight gradient ([vocab x hidden], 1187 MiB here) is in every row: a second table column
shows the peak beyond it, i.e. what the logits cost. Goal (issue 5): chunked <= 0.25 x full at the default chunk (512).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure(tokens: int, hidden: int, vocab: int, chunk: int, device: str) -> dict:
    """One forward+backward of the log-prob/entropy head; returns peak MiB above the baseline and seconds."""
    import torch

    from rllava.model.forward import logprobs_from_hidden

    torch.manual_seed(0)
    dev = torch.device(device)
    head = torch.nn.Linear(hidden, vocab, bias=False, device=dev)
    h = torch.randn(tokens, hidden, device=dev, requires_grad=True)
    labels = torch.randint(0, vocab, (tokens,), device=dev)
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**20
    else:
        base = _rss_mib()
    start = time.perf_counter()
    lp, ent = logprobs_from_hidden(head, h, labels, with_entropy=True, entropy_grad=True, chunk_size=chunk)
    (lp.mean() + 0.01 * ent.mean()).backward()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"chunk": chunk, "peak_mib": peak - base, "seconds": time.perf_counter() - start}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--chunks", type=int, nargs="+", default=[1024, 512, 256])
    p.add_argument("--device", default="cuda" if _cuda() else "cpu")
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: run one chunk size, print JSON
    args = p.parse_args(argv)
    if args.one is not None:
        print(json.dumps(measure(args.tokens, args.hidden, args.vocab, args.one, args.device)))
        return
    common = ["--tokens", str(args.tokens), "--hidden", str(args.hidden), "--vocab", str(args.vocab),
              "--device", args.device]
    rows = []
    for chunk in [-1, *args.chunks]:
        out = subprocess.run([sys.executable, __file__, *common, "--one", str(chunk)], capture_output=True,
                             text=True, check=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    full = rows[0]["peak_mib"]
    logits_mib = args.tokens * args.vocab * 4 / 2**20
    print(f"log-prob + entropy, forward+backward: {args.tokens} tokens, hidden {args.hidden}, vocab {args.vocab}, "
          f"fp32, {args.device} (one [tokens x vocab] fp32 tensor = {logits_mib:.0f} MiB)\n")
    grad_mib = args.vocab * args.hidden * 4 / 2**20  # the head's weight gradient: the same in every row
    print(f"| logprob_chunk_size | peak MiB | x full | beyond the {grad_mib:.0f} MiB head gradient | x full | seconds |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        name = "full (-1)" if r["chunk"] <= 0 else str(r["chunk"])
        extra = r["peak_mib"] - grad_mib
        print(f"| {name} | {r['peak_mib']:.0f} | {r['peak_mib'] / full:.3f} | {extra:.0f} | "
              f"{extra / (full - grad_mib):.3f} | {r['seconds']:.1f} |")


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


if __name__ == "__main__":
    main()
