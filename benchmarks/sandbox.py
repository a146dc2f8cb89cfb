"""What one call of the code sandbox costs: the latency of `rllava.agent.sandbox.run_code` for typical snippets.

    python benchmarks/sandbox.py [--calls 30] [--workers 1,8]

For each snippet (an empty one, one that uses PIL on the given image and saves one back, one that imports
numpy) it runs `--calls` calls one after another (and, for each `--workers` > 1, `--calls` calls from that many
threads at once, as the code tool's pool does) and prints the median and 90th-percentile latency of a call and
the calls per second. Prints the jail the machine gives first (which guards hold).
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--workers", default="1,8")
    a = p.parse_args()
    image, limits = Image.new("RGB", (224, 224), (200, 30, 30)), Limits()
    first = run_code("print('warm-up')", [image], limits)  # starts what a process starts once
    print(f"guards: {first.guards}\n")
    print(f"| snippet | workers | median ms | p90 ms | calls/s |\n|---|---|---|---|---|")
    for name, code in SNIPPETS.items():
        for workers in map(int, a.workers.split(",")):
            def one(_):
                t = time.perf_counter()
                result = run_code(code, [image], limits)
                assert result.ok, result.text()
                return time.perf_counter() - t

            start = time.perf_counter()
            with ThreadPoolExecutor(workers) as pool:
                times = sorted(pool.map(one, range(a.calls)))
            wall = time.perf_counter() - start
            p90 = times[min(len(times) - 1, int(0.9 * len(times)))]
            print(f"| {name} | {workers} | {1000 * statistics.median(times):.0f} | {1000 * p90:.0f} | "
                  f"{a.calls / wall:.1f} |")


if __name__ == "__main__":
    main()
