"""`python -m vitlab ...`, and so `torchrun --nproc_per_node=N -m vitlab finetune ...`: the `vitlab` command."""

from vitlab.cli import run

if __name__ == "__main__":
    run()
