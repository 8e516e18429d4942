// Key policy `{{name}}`: one message per user, event type and channel. The
// key body is `<biz_type>:<user_id>`; the host adds `push:{{name}}@<major>:<channel>:`.
// Build: `npm install && npm run build`; test: `npm test` (pushonce plugins test).
import { part } from "./key-util.js";

// Who this plugin is: keep it equal to package.json (componentize-js cannot import JSON).
export function describe() {
  return {
    name: "{{name}}",
    version: "0.1.0",
    description: "One message per user, event type and channel.",
  };
}

export const keyPolicy = {
  // Throwing a string is the `err` of `derive-key`: say what is wrong with the input.
  deriveKey(event, _channel, _params) {
    if (event.bizType === "") throw "event field `biz_type` is empty";
    if (event.userId === "") throw "event field `user_id` is empty";
    return { key: `${part(event.bizType)}:${part(event.userId)}` };
  },
};
