"""The training pipelines, each run as `python -m rllava.train.pipeline.<name> config=FILE k=v ...`. Run that way,
this package is imported before the pipeline's module: `rllava.train.cli.command_line` checks the config and
chooses torch's threads before the module imports torch and transformers."""

import sys

# runpy imports the parent packages of `-m <module>` while argv[0] is still "-m"; argv ends with the arguments
if sys.argv[:1] == ["-m"]:
    _module = sys.orig_argv[-len(sys.argv)].removeprefix("-m")
    if _module.startswith(__name__ + "."):
        from rllava.train.cli import command_line

        command_line(sys.argv[1:], _module)
