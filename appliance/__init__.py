"""The web side of vkllm: REST and OpenAI-compatible APIs, admin UI and metrics (appliance.app),
and the commands that drive it (`vkllm up | submit | jobs | follow | apikey`). Talks to the
workers only through Redis (vkllm.protocol); never imports the engine."""
