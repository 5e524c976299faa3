import json

import pytest
import torch
from factories import H, make_dataset
from PIL import Image

from hsdump.tools import inspect as hi


def chatty(n_samples=300, seed=0):
    """Samples with chat-like lengths (log-normal) and loss-masked assistant tails."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k in range(n_samples):
        n = int(torch.empty(1).log_normal_(5.0, 0.8, generator=g).clamp(2, 2048))
        frac = float(torch.rand(1, generator=g)) * 0.9 if k % 25 else 0.0
        lm = torch.zeros(n, dtype=torch.int64)
        lm[n - int(n * frac) :] = 1
        out[k * 2] = (
            torch.randint(0, 500, (n,), generator=g),
            lm,
            [torch.zeros(n, H) for _ in range(3)],
            {},
        )
    return out


@pytest.fixture
def path(tmp_path):
    return make_dataset(
        tmp_path / "ds",
        chatty(),
        per_shard=50,
        skipped={"13": "nonfinite in hidden_states[1]"},
        skipped_rows={"too_long": 4, "no_assistant_tokens": 2},
        model="tiny:llama",
    )


def test_facts(path):
    facts, lengths, fracs = hi.gather(str(path))
    data = chatty()
    assert facts["samples"] == 300 and len(lengths) == 300
    assert facts["tokens"] == sum(len(v[0]) for v in data.values())
    assert facts["loss_masked_tokens"] == sum(int(v[1].sum()) for v in data.values())
    assert facts["no_loss_samples"] == sum(int(v[1].sum()) == 0 for v in data.values()) >= 12
    assert facts["skipped_rows"] == {"too_long": 4, "no_assistant_tokens": 2}
    assert facts["skipped_samples"] == {"nonfinite in hidden_states[1]": 1}
    assert facts["layers"] == [2, 4, 5] and facts["storage_dtype"] == "bfloat16"
    assert facts["model"] == "tiny:llama" and facts["shards"] == 6
    assert facts["bytes"] == sum(p.stat().st_size for p in path.glob("shard-*"))
    assert all(0 <= f <= 1 for f in fracs)
    text = hi.format_facts(facts)
    for want in (
        "samples          300",
        "skipped rows     6 (no_assistant_tokens: 2, too_long: 4)",
        "skipped samples  1 (nonfinite in hidden_states[1]: 1)",
        "bfloat16",
        "tiny:llama",
    ):
        assert want in text, text


def test_cli_prints_and_draws(path, tmp_path, capsys):
    png = tmp_path / "h.png"
    assert hi.main([str(path), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "samples          300" in out and f"wrote {png}" in out
    img = Image.open(png)
    assert img.size == (1400, 560)
    px = img.convert("RGB")
    colors = {px.getpixel((x, y)) for x in range(0, 1400, 7) for y in range(60, 560, 7)}
    assert (76, 120, 168) in colors and (245, 133, 24) in colors  # both histograms drawn
    assert hi.main([str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["samples"] == 300
    assert hi.main([str(tmp_path / "nope")]) == 2


def test_one_sample_dataset_draws(tmp_path):
    p = make_dataset(
        tmp_path / "one", {0: (torch.tensor([1]), torch.tensor([1]), [torch.zeros(1, H)] * 3, {})}
    )
    facts, lengths, fracs = hi.gather(str(p))
    hi.draw_png(str(tmp_path / "o.png"), facts, lengths, fracs)
    assert facts["seq_len"] == {"min": 1, "median": 1, "mean": 1.0, "max": 1}
