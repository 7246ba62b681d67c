"""Slurm: what a cluster offers (``facts``), whether a run's jobs can start there
(``preflight``), and jobs of a run that will never finish (``watchdog``)."""
