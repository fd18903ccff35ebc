"""The cluster half: Slurm job scripts for each site (`launch`), seed and hyperparameter sweeps as job
arrays (`sweep`) and their summaries (`summarize`). It starts training jobs; the training code never
imports it."""
