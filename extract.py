"""hsdump's Hydra entry point: `python extract.py [overrides]`, or `make extract`."""

import logging
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from hsdump.config import register_configs, to_config
from hsdump.pipeline import Interrupted, run

register_configs()
log = logging.getLogger("hsdump")


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    resolved = OmegaConf.to_container(cfg, resolve=True)
    try:
        summary = run(to_config(cfg), resolved_config=resolved)
    except Interrupted as e:
        log.error("%s", e)
        sys.exit(3)
    except (ValueError, FileNotFoundError) as e:  # bad input: the message names the fix
        log.error("%s", e)
        sys.exit(2)
    for line in summary.lines():
        print(line)


if __name__ == "__main__":  # required: SGLang spawns its scheduler processes
    main()
