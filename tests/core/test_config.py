import pytest

from harness.core.config import Config, ConfigError, load_config


def test_defaults_match_the_issue():
    config = load_config()
    assert (config.trials, config.atol, config.rtol, config.allow_tf32, config.check_grad) == (5, None, None, False,
                                                                                                True)


def test_precedence_cli_over_yaml_over_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("trials: 3\ncheck_grad: false\n")
    config = load_config(path, {"trials": 7, "check_grad": None})
    assert config.trials == 7           # CLI wins
    assert config.check_grad is False   # YAML's false is kept, not replaced by the default
    assert config.seed == Config().seed


def test_unknown_key_names_file_and_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("trails: 3\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*'trails'"):
        load_config(path)


def test_wrong_type_names_file_and_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("check_grad: 'yes'\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: key 'check_grad' must be bool"):
        load_config(path)


@pytest.mark.parametrize("text, key", [("trials: 0\n", "trials"), ("device: tpu\n", "device"),
                                       ("atol: -1\n", "atol"), ("- a\n", "top level")])
def test_invalid_values(tmp_path, text, key):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=key):
        load_config(path)


def test_missing_file():
    with pytest.raises(ConfigError, match="not found"):
        load_config("/nonexistent/config.yaml")


def test_hash_changes_with_verdict_settings():
    assert load_config(None, {"atol": 1e-2}).hash() != load_config().hash()
