"""hsdump's Hydra entry point: `python extract.py [overrides]`, or `make extract`.

The installed command `hsdump extract [overrides]` runs the same task (hsdump.cli.extract_job)
with the same configs (this checkout's conf/, shipped inside the wheel as hsdump/conf).
"""

import hydra
from omegaconf import DictConfig

from hsdump.cli import extract_job, finish, register_resolvers, run_app
from hsdump.config import register_configs

register_configs()
register_resolvers()


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    extract_job(cfg)


if __name__ == "__main__":  # required: SGLang spawns its scheduler processes
    finish(run_app, main)  # Hydra's usage errors exit 2, as docs/errors.md says
