// Key policy `per-user-per-week`: at most one message per user and channel
// per ISO 8601 week (Monday to Sunday). The key body is `<user_id>:<YYYY>-W<ww>`
// (the ISO week-numbering year and week) of the event's `occurred-at-ms` in the
// fixed offset of param `tz` (`+08:00`; default `+00:00`).
import { part, param, parseOffset, civilFromDays } from "./key-util.js";

// Who this plugin is: the same as package.json says (componentize-js cannot
// import JSON; the tests check the two agree).
export function describe() {
  return {
    name: "per-user-per-week",
    version: "1.0.0",
    description: "Key per user and channel per ISO 8601 week (Monday to Sunday) in the fixed offset of param tz.",
  };
}

export const keyPolicy = {
  deriveKey(event, _channel, params) {
    const tz = param(params, "tz") ?? "+00:00";
    const offset = parseOffset(tz);
    if (offset === null) {
      throw `param \`tz\`: \`${tz}\` is not a fixed UTC offset like \`+08:00\` (at most ±18:00)`;
    }
    if (event.userId === "") throw "event field `user_id` is empty";
    const days = Math.floor((Number(event.occurredAtMs / 1000n) + offset) / 86400);
    const thursday = days - ((days + 3) % 7 + 7) % 7 + 3; // the Thursday of its Mon–Sun week
    const [year] = civilFromDays(thursday);
    const week = Math.floor((thursday - daysFromCivil(year, 1, 1)) / 7) + 1;
    return { key: `${part(event.userId)}:${year}-W${String(week).padStart(2, "0")}` };
  },
};

/** Days since 1970-01-01 of a proleptic Gregorian date. */
function daysFromCivil(y, m, d) {
  const yy = m <= 2 ? y - 1 : y;
  const era = Math.floor(yy / 400);
  const yoe = yy - era * 400;
  const doy = Math.floor((153 * (m > 2 ? m - 3 : m + 9) + 2) / 5) + d - 1;
  return era * 146097 + yoe * 365 + Math.floor(yoe / 4) - Math.floor(yoe / 100) + doy - 719468;
}
