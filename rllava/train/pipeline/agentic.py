"""Multi-turn agent RL (RLLaVA's entry point): the RLVR pipeline with the agent rollout driver.

    python -m rllava.train.pipeline.agentic config=... rollout.agent.tools=[search,zoom] k=v
    python -m rllava.train.pipeline.agentic config=... rollout.env_config_path=env.yaml k=v   # RLLaVA's files

The loop and step of `rllava.train.pipeline.rlvr` (which runs agents too), insisting that tools or an environment
are configured: an agentic script never silently trains a single turn. The driver is
`rllava.agent.rollout.AgentRollout`; tools and their keys are in docs/agents.md.
"""

from rllava.config import ConfigError
from rllava.config.schema import agent_on
from rllava.train.cli import run_cli
from rllava.train.pipeline.rlvr import train


def train_agent(cfg) -> str:
    if not agent_on(cfg):
        raise ConfigError("rllava.train.pipeline.agentic runs multi-turn agents: set rollout.agent.tools (e.g. "
                          "[search] or [zoom]), rollout.tool_config_path or rollout.env_config_path; single-turn "
                          "tasks run with rllava.train.pipeline.rlvr")
    return train(cfg)


def main(argv: list[str] | None = None) -> None:
    run_cli(train_agent, argv)


if __name__ == "__main__":
    main()
