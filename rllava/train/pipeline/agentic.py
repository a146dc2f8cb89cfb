"""RLLaVA's multi-turn agent pipeline (tools, environments, rollout.max_turns): not available yet in rllava.

    python -m rllava.train.pipeline.agentic ...   -> one line naming what to use instead, exit status 2

Until it lands, single-turn tasks run with `rllava.train.pipeline.rlvr`.
"""

from rllava.train.pipeline._not_available import not_available

INSTEAD = "single-turn tasks run with rllava.train.pipeline.rlvr"


def main(argv: list[str] | None = None) -> None:
    not_available("rllava.train.pipeline.agentic", "multi-turn agent rollouts with tools", INSTEAD)


if __name__ == "__main__":
    main()
