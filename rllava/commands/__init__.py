"""The commands around the library: each a `python -m rllava.commands.<name>` that uses the library, none that
the library uses. The planner (`memory`), the proof (`make proof`), the demo, sweeps and their comparison,
curves, and the export of a checkpoint to a Hugging Face folder. Their budget is 2,500 lines, the library's
15,000 (README, "Size")."""
