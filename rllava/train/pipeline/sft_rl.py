"""RLLaVA's SFT+RL hybrid pipeline (LUFFY, SRFT, HPT, CHORD, UFT): not available yet in rllava.

    python -m rllava.train.pipeline.sft_rl ...   -> one line naming what to use instead, exit status 2

Until it lands, the two halves run one after the other: `rllava.train.pipeline.sft` (data.target_key) to warm the
model up, then `rllava.train.pipeline.rlvr` from its outputs_dir/final.
"""

from rllava.train.pipeline._not_available import not_available

INSTEAD = ("run rllava.train.pipeline.sft (data.target_key=...) then rllava.train.pipeline.rlvr from its "
           "outputs_dir/final")


def main(argv: list[str] | None = None) -> None:
    not_available("rllava.train.pipeline.sft_rl", "SFT+RL hybrids: LUFFY, SRFT, HPT, CHORD, UFT", INSTEAD)


if __name__ == "__main__":
    main()
