"""What the Snakemake workflow (``workflow/``) imports from hpcmem."""
