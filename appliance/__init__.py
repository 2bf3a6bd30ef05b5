"""The web side of vkllm: REST and OpenAI-compatible APIs, admin UI and metrics (appliance.app),
the Redis contract shared with the workers (appliance.protocol) and the CLI commands."""
