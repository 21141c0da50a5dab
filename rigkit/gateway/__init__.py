"""The LiteLLM gateway (role gateway, templates/gateway/, docs/gateway.md): one OpenAI endpoint over
every replica of every model on every rig. Which rigs it reaches and how, from the inventory's
RigViews (plan), the proxy's config with the drain filter's callback (config), its secrets
file, compose file and the rig-side helper's settings (stack), whether its project runs (facts)
and verification through it (verify). The drain is rig-side: the helper templates/gateway/rigkit-gateway
writes drained.json, which the filter templates/gateway/rigkit_drain.py reads inside LiteLLM; the
control machine asks for it (drain) in `rigkit rollout`, one rig at a time (rollout)."""

# The LiteLLM release rigkit renders its config for and tests against (from PyPI, `litellm[proxy]`);
# the production image in rigkit/config/schema.py (LITELLM_IMAGE) is the same release. Never 1.107.0.
LITELLM_VERSION = "1.103.0"
