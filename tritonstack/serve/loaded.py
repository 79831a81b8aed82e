"""What a running server has loaded, asked of the server itself (its repository may
be remote, or not the one the launcher was given), and loading it again with config
overrides: Triton's load API takes a model's config in the request, so a setting
changes at load while the repository's files stay as they are (the latency objective,
tritonstack.serve.queue_ceilings; the layout, tritonstack.serve.layout)."""

from __future__ import annotations

import concurrent.futures
import json

import tritonclient.http as httpclient

# Triton's own default for --model-load-thread-count.
CONCURRENT_LOADS = 4


def loaded_configs(http_url: str, headers: dict[str, str]) -> list[dict]:
    """The configs of the models the server has READY (the index needs the admin key)."""
    with httpclient.InferenceServerClient(http_url) as client:
        index = client.get_model_repository_index(headers=headers)
        ready = [entry["name"] for entry in index if entry.get("state") == "READY"]
        return [client.get_model_config(name, headers=headers) for name in ready]


def ensemble_steps(configs: list[dict]) -> set[str]:
    """Every model that is a step of a loaded ensemble."""
    steps = (config.get("ensemble_scheduling", {}).get("step", []) for config in configs)
    return {step["model_name"] for ensemble in steps for step in ensemble}


def differs(changed: dict, config: dict) -> bool:
    """Whether `changed` says anything `config` does not. Triton's JSON spells 64-bit
    integers as strings: the values are compared, not their spelling."""
    return _normalized(changed) != _normalized(config)


def _normalized(config: dict) -> str:
    return json.dumps(config, sort_keys=True, default=str).replace('"', "")


def load_overrides(http_url: str, headers: dict[str, str], configs: list[dict]) -> list[str]:
    """Load each model of `configs` again with that config, the steps before the
    ensembles (an ensemble loads against its steps); their names. The steps load side by
    side, as Triton loads a repository at start-up (one at a time, the default
    repository's objective took 37 s to start where 11 s loaded it; side by side 20 s).
    The ensembles load one at a time: two loaded at once that share a step were refused
    by Triton 2.51 ("Newer operation has been applied to the model lifecycle")."""
    steps = [config for config in configs if config.get("platform") != "ensemble"]
    ensembles = [config for config in configs if config.get("platform") == "ensemble"]
    with concurrent.futures.ThreadPoolExecutor(max_workers=CONCURRENT_LOADS) as pool:
        list(pool.map(lambda config: _load(http_url, headers, config), steps))
    for config in ensembles:
        _load(http_url, headers, config)
    return [config["name"] for config in configs]


def _load(http_url: str, headers: dict[str, str], config: dict) -> None:
    with httpclient.InferenceServerClient(http_url, network_timeout=300) as client:
        client.load_model(config["name"], headers=headers, config=json.dumps(config))
