"""The LiteLLM gateway (role gateway, templates/gateway/, docs/gateway.md): one OpenAI endpoint over
every replica of every model on every rig. Which rigs it reaches and how (topology), the proxy's
config (config), its secrets file and compose file (stack), and the drain used by `rigkit rollout`
(drain)."""

# The LiteLLM release rigkit renders its config for and tests against (from PyPI, `litellm[proxy]`);
# the production image in rigkit/config/schema.py (LITELLM_IMAGE) is the same release. Never 1.107.0.
LITELLM_VERSION = "1.103.0"
