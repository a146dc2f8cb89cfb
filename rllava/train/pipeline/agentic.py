"""RLLaVA's multi-turn agent pipeline module (`-m rllava.train.pipeline.agentic`): not available yet.

Agents will be rollout drivers beside `rllava/roles/rollout.py` in the shared loop; until they land, an RLLaVA
agent script gets one line saying so (exit 2) instead of "No module named", and never trains single-turn
silently (the agent keys `rollout.max_turns`, `tool_config_path`, ... are start-up errors too).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    print("rllava: error: multi-turn agents (rllava.train.pipeline.agentic) are not available yet in rllava; "
          "single-turn RL runs with -m rllava.train.pipeline.rlvr", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()
