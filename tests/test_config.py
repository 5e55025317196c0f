"""Configuration: validation names the bad key, env interpolation, and the example documents every key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from gateway.config import GatewayConfig, hash_key, load_config, parse_config
from gateway.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "config.example.yaml"


def minimal(**upstream: Any) -> dict[str, Any]:
    return {
        "tenants": [{"name": "t", "api_keys": ["k"], "upstream": {"base_url": "http://x/v1", **upstream}}]
    }


def model_paths(model: type[BaseModel], prefix: str = "") -> set[str]:
    paths: set[str] = set()
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        paths.add(path)
        annotation = field.annotation
        inner = getattr(annotation, "__args__", (annotation,))
        for candidate in (annotation, *inner):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                paths |= model_paths(candidate, f"{path}.")
    return paths


def yaml_paths(value: object, prefix: str = "") -> set[str]:
    paths: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}{key}"
            paths.add(path)
            paths |= yaml_paths(item, f"{path}.")
    elif isinstance(value, list):
        for item in value:
            paths |= yaml_paths(item, prefix)
    return paths


def test_example_documents_every_key_and_only_real_keys() -> None:
    documented = yaml_paths(yaml.safe_load(EXAMPLE.read_text()))
    # `advanced:` blocks merge into the sections beside them.
    folded = {p.replace("advanced.", "") for p in documented if not p.endswith("advanced")}
    assert folded == model_paths(GatewayConfig)


def user_facing(value: object, prefix: str = "") -> set[str]:
    """The settings written outside `advanced:`; a list (keys, priced models) is one setting."""
    paths: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "advanced":
                continue
            nested = user_facing(item, f"{prefix}{key}.")
            paths |= nested or {f"{prefix}{key}"}
    elif isinstance(value, list) and value and isinstance(value[0], dict) and "name" in value[0]:
        for item in value:  # tenants: each tenant's settings
            paths |= user_facing(item, prefix)
    return paths


def test_the_example_shows_at_most_forty_settings_outside_advanced() -> None:
    shown = user_facing(yaml.safe_load(EXAMPLE.read_text()))
    assert "tenants.upstream.base_url" in shown and "storage.database_url" in shown
    assert "tenants.upstream.max_connections" not in shown and "jobs.poll_seconds" not in shown
    assert len(shown) <= 40, sorted(shown)


def test_advanced_merges_into_the_sections_beside_it() -> None:
    data = minimal()
    data["advanced"] = {"jobs": {"poll_seconds": 0.5}, "storage": {"index": "memory"}}
    data["tenants"][0]["advanced"] = {"retrieval": {"neighbours": 2, "embedder": {"batch_size": 8}}}
    data["tenants"][0]["retrieval"] = {"embedder": {"provider": "fake"}}
    config = parse_config(data, {})
    assert config.jobs.poll_seconds == 0.5 and config.storage.index == "memory"
    retrieval = config.tenants[0].retrieval
    assert retrieval.neighbours == 2
    assert (retrieval.embedder.provider, retrieval.embedder.batch_size) == ("fake", 8)


@pytest.mark.parametrize(
    ("value", "read"), [(None, "composed"), (True, "model"), (False, "off"), ("model", "model")]
)
def test_neighbour_vectors_reads_its_old_switch(value: object, read: str) -> None:
    data = minimal()
    if value is not None:
        data["tenants"][0]["advanced"] = {"retrieval": {"neighbour_vectors": value}}
    assert parse_config(data, {}).tenants[0].retrieval.neighbour_vectors == read


def test_an_unknown_neighbour_vectors_value_is_named() -> None:
    data = minimal()
    data["tenants"][0]["advanced"] = {"retrieval": {"neighbour_vectors": "sometimes"}}
    with pytest.raises(ConfigError, match=r"neighbour_vectors"):
        parse_config(data, {})


def test_the_history_memos_old_count_still_reads_in_bytes() -> None:
    data = minimal()
    data["advanced"] = {"storage": {"history_memo_messages": 1000}}
    assert parse_config(data, {}).storage.history_memo_bytes == 1000 * 1024
    data["advanced"] = {"storage": {"history_memo_messages": 1000, "history_memo_bytes": 5}}
    with pytest.raises(ConfigError, match="history_memo_messages was replaced by history_memo_bytes"):
        parse_config(data, {})


@pytest.mark.parametrize(
    ("advanced", "message"),
    [
        ({"jobs": {"workers": 1}}, r"jobs\.workers is set twice"),
        ({"tenants": {}}, r"advanced\.tenants: not a section"),
        ({"nope": {}}, r"advanced\.nope: not a section"),
        ({"jobs": 3}, r"advanced\.jobs: must be a mapping"),
        ([1], r"advanced: must be a mapping"),
    ],
)
def test_advanced_errors_name_the_key(advanced: object, message: str) -> None:
    data = minimal()
    data["jobs"] = {"workers": 2}
    data["advanced"] = advanced
    with pytest.raises(ConfigError, match=message):
        parse_config(data, {})


def test_every_example_key_has_a_comment_above_it() -> None:
    lines = EXAMPLE.read_text().splitlines()
    for number, line in enumerate(lines):
        stripped = line.strip().removeprefix("- ")
        if not stripped or stripped.startswith("#") or ":" not in stripped or stripped.startswith("${"):
            continue
        previous = lines[number - 1].strip()
        assert previous.startswith("#"), (
            f"config.example.yaml line {number + 1} ({stripped!r}) has no comment"
        )


def test_example_loads() -> None:
    config = load_config(EXAMPLE, {"OPENAI_API_KEY": "sk-x"})
    assert config.tenants[0].upstream.api_key == "sk-x"
    assert config.storage.database_url == "sqlite:///./data/gateway.db"
    assert config.storage.data_dir == "./data"


def test_defaults() -> None:
    config = parse_config(minimal(), {})
    upstream = config.tenants[0].upstream
    assert upstream.provider == "openai"
    assert config.server.port == 8080
    assert config.storage.database_url == "sqlite:///./data/gateway.db"


def test_env_interpolation_with_default_and_missing() -> None:
    config = parse_config(minimal(api_key="${KEY}", base_url="${URL:-http://fallback/v1}"), {"KEY": "secret"})
    assert config.tenants[0].upstream.api_key == "secret"
    assert config.tenants[0].upstream.base_url == "http://fallback/v1"
    with pytest.raises(ConfigError, match=r"tenants\[0\]\.upstream\.api_key: environment variable NOPE"):
        parse_config(minimal(api_key="${NOPE}"), {})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (minimal(base_url="ftp://x"), r"tenants\[0\]\.upstream\.base_url: must be an http"),
        (
            minimal(timeout_seconds=0),
            r"tenants\[0\]\.upstream\.timeout_seconds: Input should be greater than 0",
        ),
        (minimal(colour="red"), r"tenants\[0\]\.upstream\.colour: Extra inputs are not permitted"),
        (minimal(http_client="curl"), r"tenants\[0\]\.upstream: http_client 'curl' was removed"),
        ({"tenants": []}, r"tenants: Tuple should have at least 1 item"),
        (
            {"server": {"port": 70000}, **minimal()},
            r"server\.port: Input should be less than or equal to 65535",
        ),
        ({"tenants": [{"name": "t", "api_keys": ["k"], "upstream": {}}]}, r"base_url is required"),
        ({"tenants": [{"name": "t", "upstream": {"base_url": "http://x"}}]}, r"api_keys is empty"),
        ([1, 2], r"<root>: the configuration must be a mapping"),
    ],
)
def test_bad_config_names_key_and_problem(data: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(data, {})


def test_duplicate_tenants_and_shared_keys_are_rejected() -> None:
    tenant = {"name": "a", "api_keys": ["k"], "upstream": {"base_url": "http://x"}}
    with pytest.raises(ConfigError, match="tenant names must be unique; repeated: a"):
        parse_config({"tenants": [tenant, tenant]}, {})
    other = {**tenant, "name": "b", "api_keys": [f"sha256:{hash_key('k')}"]}
    with pytest.raises(ConfigError, match="share a gateway key"):
        parse_config({"tenants": [tenant, other]}, {})
    with pytest.raises(ConfigError, match=r"server\.admin_key is also a gateway key of tenant 'a'"):
        parse_config({"server": {"admin_key": "k"}, "tenants": [tenant]}, {})


def test_unreadable_and_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("tenants: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_a_pass_through_tenant_has_background_calls_only_with_a_non_empty_key_of_its_own() -> None:
    from gateway.features import compacts, learns

    def tenant_with(api_key: str | None) -> Any:
        upstream = {"base_url": "http://x/v1", "api_key": api_key, "pass_through_client_key": True}
        return parse_config({"tenants": [{"name": "t", "api_keys": [], "upstream": upstream}]}).tenants[0]

    # `${OPENAI_API_KEY:-}` with the variable unset reads as "": no key to pay for summaries or memory.
    for missing in (None, ""):
        assert not compacts(tenant_with(missing)) and not learns(tenant_with(missing))
    assert compacts(tenant_with("sk-own")) and learns(tenant_with("sk-own"))
