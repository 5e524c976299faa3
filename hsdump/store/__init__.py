"""Stage 3: the dataset on disk (docs/format.md): layout (the format's names and tables), writer, commit logs, reader, fp8. torch, safetensors and numpy only: all a trainer needs."""
