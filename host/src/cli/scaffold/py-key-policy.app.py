"""Key policy `{{name}}`: one message per user, event type and channel. The
key body is `<biz_type>:<user_id>`; the host adds `push:{{name}}@<major>:<channel>:`."""

import wit_world
from wit_world.exports import key_policy
from wit_world.imports import types
from componentize_py_types import Err

from key_util import part


class WitWorld(wit_world.WitWorld):
    def describe(self) -> types.PluginInfo:
        # Keep it equal to pyproject.toml.
        return types.PluginInfo(
            name="{{name}}",
            version="0.1.0",
            description="One message per user, event type and channel.",
        )


class KeyPolicy(wit_world.exports.KeyPolicy):
    def derive_key(self, event, channel, params) -> key_policy.KeyDecision:
        # Raising Err(text) is the `err` of `derive-key`: say what is wrong.
        if event.biz_type == "":
            raise Err("event field `biz_type` is empty")
        if event.user_id == "":
            raise Err("event field `user_id` is empty")
        key = f"{part(event.biz_type)}:{part(event.user_id)}"
        return key_policy.KeyDecision(key=key, window_secs=None)
