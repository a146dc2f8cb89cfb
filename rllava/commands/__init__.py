"""The commands around the library: each a `python -m rllava.commands.<name>` that uses the library, none that
the library uses. The planner (`memory`), the proof (`make proof`), the demo, sweeps and their comparison,
curves, and the export of a checkpoint to a Hugging Face folder. Their budget is 2,500 lines, the library's
15,000 (README, "Size"). `main` is the console script `rllava NAME ...`: the command or pipeline NAME, as its
`python -m` form runs it."""

import argparse
import difflib
import importlib
import sys

COMMANDS = {  # rllava NAME ... = python -m MODULE ...: (MODULE, what it does in one line)
    "train": ("rllava.train.pipeline.rlvr", "RL with verifiable rewards (GRPO, DAPO, ...): config=FILE key=value ..."),
    "sft": ("rllava.train.pipeline.sft", "supervised fine-tuning, the same config: ... data.target_key=KEY"),
    "memory": ("rllava.commands.memory", "will the run fit? one step's device memory, planned without a GPU"),
    "export": ("rllava.commands.export", "a checkpoint as a save_pretrained (Hugging Face) folder"),
    "compare": ("rllava.commands.compare", "runs' curves overlaid, their final and best metrics, the keys that differ"),
    "sweep": ("rllava.commands.sweep", "a grid of runs (key=v1,v2 ...), then compare over them"),
    "plot": ("rllava.commands.plot", "a run's training curves as PNGs"),
    "demo": ("rllava.commands.demo", "SFT then GRPO on a tiny model, on a CPU in minutes (make demo)"),
    "proof": ("rllava.commands.proof", "GRPO lifts each example task, on a CPU (make proof)"),
}


def command_parser(name: str, doc: str) -> argparse.ArgumentParser:
    """A command's parser: `rllava NAME` in its usage line, its docstring's first paragraph above its arguments."""
    return argparse.ArgumentParser(prog=f"rllava {name}", description=doc.split("\n\n")[0])


def usage() -> str:
    """`rllava --help`: one line per command, and the module each runs."""
    width = max(len(name) for name in COMMANDS)
    rows = [f"  {name:<{width}}  {line}" for name, (_, line) in COMMANDS.items()]
    return "\n".join(["usage: rllava COMMAND [ARGS ...]    (rllava COMMAND --help: its arguments)", "", "commands:",
                      *rows, "", "rllava NAME ... is python -m MODULE ...: train is rllava.train.pipeline.rlvr, sft "
                      "rllava.train.pipeline.sft,", "the others rllava.commands.NAME"])


def main(argv: list[str] | None = None) -> None:
    """`rllava NAME ARGS ...`: the module's own `main` reads ARGS (its parsing, its --help, its exit status); a
    pipeline's config is checked first, before it imports torch, as under `python -m` (rllava.train.pipeline)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return
    name, args = argv[0], argv[1:]
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f"did you mean '{close[0]}'?" if close else "rllava --help lists the commands"
        print(f"rllava: unknown command '{name}' ({hint})", file=sys.stderr)
        sys.exit(2)
    module = COMMANDS[name][0]
    sys.argv = [f"rllava {name}", *args]
    if module.startswith("rllava.train.pipeline."):
        from rllava.train.cli import command_line

        command_line(args, module)
    importlib.import_module(module).main()
