"""The key encoding of `plugins/key-util` (Rust) in Python, byte for byte:
`part` keeps `[A-Za-z0-9._@/-]`, escapes every other UTF-8 byte as `+XX`,
and hashes an empty or over-long part to `=` + 32 hex digits of its SHA-256.
Also `param`, `attribute` and `civil_from_days`, as in key-util."""

import hashlib

MAX_PART = 64
_PLAIN = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._@/-")


def part(value: str) -> str:
    """Encodes one key part: readable, safe, bounded, injective."""
    data = value.encode("utf-8")
    out = []
    n = 0
    for b in data:
        if n > MAX_PART:
            break
        piece = chr(b) if b in _PLAIN else "+%02X" % b
        out.append(piece)
        n += len(piece)
    if n == 0 or n > MAX_PART:
        return "=" + hashlib.sha256(data).hexdigest()[:32]
    return "".join(out)


def param(params, name):
    """The value of parameter `name` (the last one wins), or None."""
    found = None
    for k, v in params:
        if k == name:
            found = v
    return found


def attribute(attributes, name):
    """The value of event attribute `name` (the first one wins), or None."""
    for k, v in attributes:
        if k == name:
            return v
    return None


def civil_from_days(days: int):
    """The proleptic Gregorian (year, month, day) of `days` since 1970-01-01."""
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    return (yoe + era * 400 + (1 if m <= 2 else 0), m, d)
