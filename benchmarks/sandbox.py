"""What one call of the code sandbox costs: the latency of `rllava.agent.sandbox.run_code` for typical snippets.

    python benchmarks/sandbox.py [--calls 30] [--workers 1,8] [--gaps-ms 0,100]

For each snippet (an empty one, one that uses PIL on the given image and saves one back, one that imports
numpy) it runs `--calls` calls one after another, each `--gaps-ms` after the last ended (0: back to back; 100: a
model's turn between calls, as in a rollout), and, for each `--workers` > 1, `--calls` calls from that many threads
at once (as the code tool's pool does); it prints the median and 90th-percentile latency of a call, the calls per
second, and the machine's CPU per call (every process and the kernel: run it on an otherwise quiet machine).
Prints the jail the machine gives first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from PIL import Image

from rllava.agent.sandbox import Limits, run_code

SNIPPETS = {
    "print": "print('hi')\n",
    "PIL rotate + save": "from PIL import Image\nim = Image.open('image.png')\nim.rotate(90, expand=True).save('out.png')\n"
                         "print(im.size)\n",
    "numpy": "import numpy as np\nprint(np.arange(10).sum())\n",
}


def machine_cpu_s() -> float:
    """CPU seconds this machine has spent, every process and the kernel together (/proc/stat): a call's cost
    wherever it ran (the trainer, the jail's processes, bubblewrap), on a machine otherwise quiet."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:8]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--workers", default="1,8")
    p.add_argument("--gaps-ms", default="0,100", help="one-at-a-time runs: ms between a call's end and the next")
    a = p.parse_args()
    image, limits = Image.new("RGB", (224, 224), (200, 30, 30)), Limits()
    first = run_code("print('warm-up')", [image], limits)  # starts what a process starts once
    print(f"guards: {first.guards}\n")
    print(f"| snippet | workers | gap ms | median ms | p90 ms | calls/s | CPU ms/call |\n|---|---|---|---|---|---|---|")
    runs = [(1, int(g)) for g in a.gaps_ms.split(",")] + [(int(w), 0) for w in a.workers.split(",") if int(w) > 1]
    for name, code in SNIPPETS.items():
        for workers, gap in runs:
            def one(_):
                t = time.perf_counter()
                result = run_code(code, [image], limits)
                assert result.ok, result.text()
                took = time.perf_counter() - t
                time.sleep(gap / 1000)
                return took

            start, busy = time.perf_counter(), machine_cpu_s()
            with ThreadPoolExecutor(workers) as pool:
                times = sorted(pool.map(one, range(a.calls)))
            wall, busy = time.perf_counter() - start, machine_cpu_s() - busy
            p90 = times[min(len(times) - 1, int(0.9 * len(times)))]
            print(f"| {name} | {workers} | {gap} | {1000 * statistics.median(times):.0f} | {1000 * p90:.0f} | "
                  f"{a.calls / wall:.1f} | {1000 * busy / a.calls:.0f} |")


if __name__ == "__main__":
    main()
