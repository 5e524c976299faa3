"""hsdump's Hydra entry point: `python extract.py [overrides]`, or `make extract`."""

import logging

import hydra
from omegaconf import DictConfig, OmegaConf

from hsdump.config import register_configs, to_config
from hsdump.pipeline import run

register_configs()
log = logging.getLogger("hsdump")


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    resolved = OmegaConf.to_container(cfg, resolve=True)
    summary = run(to_config(cfg), resolved_config=resolved)
    for line in summary.lines():
        print(line)


if __name__ == "__main__":  # required: SGLang spawns its scheduler processes
    main()
