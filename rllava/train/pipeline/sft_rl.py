"""RLLaVA's hybrid SFT+RL pipeline module (`-m rllava.train.pipeline.sft_rl`): not available yet.

CHORD, LUFFY, UFT, HPT and SRFT will run as strategies inside the shared loop (`rllava/train/loop.py`), selected
by config from `rllava.train.pipeline.rlvr`; until they land, an RLLaVA script that launches this module gets one
line saying so (exit 2) instead of "No module named".
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    print("rllava: error: hybrid SFT+RL (rllava.train.pipeline.sft_rl: CHORD, LUFFY, UFT, HPT, SRFT) is not available "
          "yet in rllava; run RL with -m rllava.train.pipeline.rlvr or SFT with -m rllava.train.pipeline.sft",
          file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()
