import json

import pytest

from hsdump.capture.layers import eagle3_default, read_model_info, resolve_layers


def test_eagle3_default_and_presets():
    assert eagle3_default(32) == [2, 16, 29]
    assert resolve_layers(None, None, 61) == [2, 30, 58]
    assert resolve_layers(None, [3, 31, 59], 61) == [3, 31, 59]  # the kimi_k25 preset
    assert resolve_layers([5, 1], [3, 31, 59], 61) == [5, 1]  # explicit wins, order kept


@pytest.mark.parametrize(
    "layers,needle",
    [
        ([0, 2], "[0] out of range"),
        ([2, 8], "[8] out of range"),
        ([-1], "[-1] out of range"),
        ([2, 2], "repeats a layer"),
        ([], "is empty"),
    ],
)
def test_bad_layers_are_refused_with_the_fix(layers, needle):
    with pytest.raises(ValueError) as e:
        resolve_layers(layers, None, 8)
    assert needle in str(e.value)
    assert "capture.layers" in str(e.value)


def test_a_default_too_wide_for_a_shallow_model_names_the_fix():
    """EAGLE-3's default [2, L // 2, L - 3] repeats a layer below 7 layers: refused with the
    layers to name instead (the user wrote none)."""
    with pytest.raises(ValueError) as e:
        resolve_layers(None, None, 6)
    assert "EAGLE-3 default=[2, 3, 3]" in str(e.value) and "6-layer model" in str(e.value)
    assert "capture.layers='[2, 3]'" in str(e.value)
    assert resolve_layers([2, 3], None, 6) == [2, 3]  # the fix it names is accepted


def test_model_info_from_config(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["DeepseekV3ForCausalLM"],
                "hidden_size": 7168,
                "num_hidden_layers": 61,
                "max_position_embeddings": 163840,
            }
        )
    )
    info = read_model_info(str(tmp_path))
    assert (info.architecture, info.hidden_size, info.num_hidden_layers) == (
        "DeepseekV3ForCausalLM",
        7168,
        61,
    )
