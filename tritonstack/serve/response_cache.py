"""The ensembles' response cache, turned on by the server that has a cache, without
writing the repository: each loaded ensemble whose config does not enable
`response_cache` is loaded again through Triton's model-control API with its own
config plus `response_cache { enable: true }` (the load API takes a config override;
the files stay as they are). An ensemble has no backend: reloading it reloads no step.
`tritonstack build --response-cache` writes the same setting into a repository."""

from __future__ import annotations

import json

import tritonclient.http as httpclient


def cached(config: dict) -> bool:
    return bool(config.get("response_cache", {}).get("enable"))


def cache_ensembles(http_url: str, headers: dict[str, str], configs: list[dict]) -> list[str]:
    """Every ensemble of the loaded `configs` by name, each one now answering repeats from the cache."""
    ensembles = [config for config in configs if config.get("ensemble_scheduling")]
    with httpclient.InferenceServerClient(http_url) as client:
        for config in ensembles:
            if not cached(config):
                client.load_model(
                    config["name"], headers=headers, config=json.dumps(config | {"response_cache": {"enable": True}})
                )
    return [config["name"] for config in ensembles]
