"""A LiteLLM callback that plays a gateway which does not pass usage through streaming. TEST
INFRASTRUCTURE: loaded by the tests' LiteLLM (litellm_settings.callbacks: strip_usage.handler) to
show that verification through the gateway fails when no usage reaches the client, instead of
counting tokens from chunks. It drops `usage` from every streamed chunk, and drops the chunks that
carried only usage (no choices), as a proxy that rebuilds chunks from their text would.
Only for the model names in STRIP_USAGE_MODELS (comma-separated; unset: every model), so one proxy
can serve a model that keeps its usage beside one that loses it.
"""

import os

from litellm.integrations.custom_logger import CustomLogger


class StripUsage(CustomLogger):
    async def async_post_call_streaming_iterator_hook(self, user_api_key_dict, response, request_data):
        only = {m for m in os.environ.get("STRIP_USAGE_MODELS", "").split(",") if m}
        if only and (request_data or {}).get("model") not in only:
            async for chunk in response:
                yield chunk
            return
        async for chunk in response:
            if not getattr(chunk, "choices", None):
                continue
            if getattr(chunk, "usage", None) is not None:
                try:
                    del chunk.usage
                except AttributeError:
                    chunk.usage = None
            yield chunk


handler = StripUsage()
