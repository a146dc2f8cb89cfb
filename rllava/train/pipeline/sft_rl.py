"""RLLaVA's SFT+RL pipeline module (its LUFFY, SRFT, HPT, UFT scripts run it): in rllava the hybrids are a
strategy inside the RLVR step (`rllava.train.hybrid_step`), so this is `rllava.train.pipeline.rlvr` under its
RLLaVA name; the loss and strategy keys pick the method (docs/algorithms.md).

    python -m rllava.train.pipeline.sft_rl config=... actor.policy_loss.loss_mode=luffy algorithm.prefix_strategy=random
"""

from rllava.train.pipeline.rlvr import main

if __name__ == "__main__":
    main()
