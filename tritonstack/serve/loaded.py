"""What a running server has loaded, asked of the server itself (its repository may
be remote, or not the one the launcher was given)."""

from __future__ import annotations

import tritonclient.http as httpclient


def loaded_configs(http_url: str, headers: dict[str, str]) -> list[dict]:
    """The configs of the models the server has READY (the index needs the admin key)."""
    with httpclient.InferenceServerClient(http_url) as client:
        index = client.get_model_repository_index(headers=headers)
        ready = [entry["name"] for entry in index if entry.get("state") == "READY"]
        return [client.get_model_config(name, headers=headers) for name in ready]
