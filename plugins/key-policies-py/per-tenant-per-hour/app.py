"""Key policy `per-tenant-per-hour`: at most one message per tenant and
channel per UTC hour. The key body is `tenant=<tenant>:<YYYY-MM-DD>T<HH>`; the
tenant is the event attribute named by param `tenant_attr` (default
`tenant_id`), and a missing or empty attribute is an error naming it."""

import wit_world
from wit_world.exports import key_policy
from wit_world.imports import types
from componentize_py_types import Err

from key_util import attribute, civil_from_days, param, part


class WitWorld(wit_world.WitWorld):
    def describe(self) -> types.PluginInfo:
        # The same as pyproject.toml says (the tests check the two agree).
        return types.PluginInfo(
            name="per-tenant-per-hour",
            version="1.0.0",
            description="Key per tenant and channel per UTC hour: the tenant is the event attribute named by param tenant_attr (default tenant_id).",
        )


class KeyPolicy(wit_world.exports.KeyPolicy):
    def derive_key(self, event, channel, params) -> key_policy.KeyDecision:
        attr = param(params, "tenant_attr")
        if attr is None:
            attr = "tenant_id"
        tenant = attribute(event.attributes, attr)
        if tenant is None:
            raise Err(f"event attribute `{attr}` (the tenant, param `tenant_attr`) is missing")
        if tenant == "":
            raise Err(f"event attribute `{attr}` (the tenant) is empty")
        hours = event.occurred_at_ms // 3_600_000
        y, m, d = civil_from_days(hours // 24)
        key = f"tenant={part(tenant)}:{y:04}-{m:02}-{d:02}T{hours % 24:02}"
        return key_policy.KeyDecision(key=key, window_secs=None)
