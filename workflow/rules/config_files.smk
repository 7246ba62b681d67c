# Config files read safely before Snakemake loads them: one line, naming the file and the line,
# for a file that is not UTF-8 text or that holds YAML aliases (*name), which none of the
# workflow's settings needs and which a few nested ones turn into gigabytes (an alias bomb).

import os

from snakemake.exceptions import WorkflowError

from hpcmem.textfiles import TextFileError, read_yaml


def check_config_files(paths):
    """Stop with a one-line WorkflowError naming the first config file that is refused."""
    for path in paths:
        try:
            read_yaml(path)
        except TextFileError as error:
            raise WorkflowError(f"config file {error}") from None


check_config_files(
    [path for path in ["config/config.yaml", *workflow.configfiles] if os.path.exists(path)]
)
