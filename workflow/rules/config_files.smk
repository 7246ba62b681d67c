# Config files read safely before Snakemake loads them: one line, naming the file and the line,
# for a file that is not a mapping in UTF-8 text, or that holds YAML aliases (*name), which
# none of the workflow's settings needs and which a few nested ones turn into gigabytes (an
# alias bomb). Snakemake reads the files given with --configfile itself, before this runs:
# hpcmem/workflow/config.py checks those first for the documented entry points.

import os

from hpcmem.workflow.config import read_config_file
from hpcmem.workflow.refusal import refuse_bad_input


with refuse_bad_input("config file "):
    for path in ["config/config.yaml", *workflow.configfiles]:
        if os.path.exists(path):
            read_config_file(path)
