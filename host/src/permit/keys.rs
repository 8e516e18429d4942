//! The key layout (version 5): which shard an accept lands in, the names of
//! the Redis keys of that shard, and task ids that carry their shard.
//!
//! Every key of one permit, its task and the queue entries that name it share
//! the hash tag `{<ns>:<shard>}`, so each script touches one cluster slot.
//! A key that names its recipient (the user's encoded part is a segment of
//! the key body) lands in the recipient's shard, so every channel of one
//! (event, user) and the user's caps share one tag; any other key lands in
//! the shard of the key. See `docs/redis.md`, "Key layout".

use sha2::{Digest, Sha256};

/// The key layout of one namespace: the prefix and the number of shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Prefix inside every hash tag (`po` by default); lets several
    /// deployments or a benchmark share one Redis without meeting.
    namespace: String,
    /// How many shards the keys are spread over (at least 1).
    shards: u16,
}

impl Layout {
    /// A layout with `shards` shards (0 is taken as 1) under `namespace`.
    pub fn new(namespace: impl Into<String>, shards: u16) -> Layout {
        Layout {
            namespace: namespace.into(),
            shards: shards.max(1),
        }
    }

    /// Number of shards.
    pub fn shards(&self) -> u16 {
        self.shards
    }

    /// The namespace inside every hash tag.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The shard of an idempotency key: the first four bytes of its SHA-256, modulo the shard count.
    /// Stable across processes, versions and platforms.
    pub fn shard_of(&self, key: &str) -> u16 {
        let digest = Sha256::digest(key.as_bytes());
        let n = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
        (n % u32::from(self.shards)) as u16
    }

    /// The shard of a recipient: [`Layout::shard_of`] its encoded key part
    /// ([`key_part`]), the very segment a key naming it carries.
    pub fn recipient_shard(&self, user: &str) -> u16 {
        self.shard_of(&key_part(user))
    }

    /// The shard an accept of `key` for `recipient` lands in: the
    /// recipient's shard when the key names it ([`names_recipient`]),
    /// otherwise the shard of the key. Two accepts of one key for one
    /// recipient always meet in one shard; see `docs/redis.md` for why two
    /// accepts of one key for different recipients do too, but for a key
    /// naming both.
    pub fn shard_for(&self, key: &str, recipient: Option<&str>) -> u16 {
        match recipient {
            Some(user) if names_recipient(key, user) => self.recipient_shard(user),
            _ => self.shard_of(key),
        }
    }

    /// Every shard the permit of `key` can live in, whoever it was accepted
    /// for: the shard of the key and the shard of each segment of its body
    /// (each could be a recipient's part), without repeats. A look-up by
    /// key alone reads these.
    pub fn candidate_shards(&self, key: &str) -> Vec<u16> {
        let mut shards = vec![self.shard_of(key)];
        for segment in body_segments(key) {
            let shard = self.shard_of(segment);
            if !shards.contains(&shard) {
                shards.push(shard);
            }
        }
        shards
    }

    /// The hash tag of a shard, braces included: `{po:3}`.
    pub fn tag(&self, shard: u16) -> String {
        format!("{{{}:{}}}", self.namespace, shard)
    }

    /// The permit of an idempotency key in `shard`:
    /// `{po:3}:permit:<`[`permit_digest`]` of the key>`, one length whatever
    /// the key's. After the accept, the shard is the one its task id names.
    pub fn permit_in(&self, shard: u16, key: &str) -> String {
        format!("{}:permit:{}", self.tag(shard), permit_digest(key))
    }

    /// The permit of `key` accepted for `recipient` ([`Layout::shard_for`]).
    pub fn permit(&self, key: &str, recipient: Option<&str>) -> String {
        self.permit_in(self.shard_for(key, recipient), key)
    }

    /// Prefix of every task key of a shard: `{po:3}:task:`.
    pub(crate) fn task_prefix(&self, shard: u16) -> String {
        format!("{}:task:", self.tag(shard))
    }

    /// The task record: `{po:3}:task:<task-id>`; the shard is read from the id.
    pub fn task(&self, task_id: &str) -> Option<String> {
        let shard = shard_of_task(task_id)?;
        Some(format!("{}{}", self.task_prefix(shard), task_id))
    }

    /// The ready stream of a shard: `{po:3}:ready`.
    pub fn ready(&self, shard: u16) -> String {
        format!("{}:ready", self.tag(shard))
    }

    /// The delayed set of a shard (retries scored by due time): `{po:3}:delayed`.
    pub fn delayed(&self, shard: u16) -> String {
        format!("{}:delayed", self.tag(shard))
    }

    /// The index of a shard's failed and dead tasks (scored by when they
    /// ended), for operators: `{po:3}:dead`. Written by `record.lua`,
    /// trimmed to the retention there, emptied by `requeue.lua`.
    pub fn dead(&self, shard: u16) -> String {
        format!("{}:dead", self.tag(shard))
    }

    /// The index of a shard's held (`unknown`) tasks, scored by when they
    /// were held, for operators: `{po:3}:held`. Written by `record.lua`; an
    /// entry leaves it when its task moves on (`receipt.lua`,
    /// `reconcile.lua`, or a later outcome in `record.lua`). The scripts
    /// name it after the awaiting index (same hash tag).
    pub fn held(&self, shard: u16) -> String {
        format!("{}:held", self.tag(shard))
    }

    /// The index of a shard's tasks awaiting confirmation (`sent` without a
    /// receipt, or `unknown`), scored by when the reconciler's next check of
    /// each is due (Redis clock, ms): `{po:3}:awaiting`. Written by
    /// `record.lua`, `claim.lua` and `reconcile.lua`; an entry leaves it when
    /// its task moves on (`receipt.lua`, `requeue.lua`, `reconcile.lua`).
    pub fn awaiting(&self, shard: u16) -> String {
        format!("{}:awaiting", self.tag(shard))
    }

    /// The namespace's layout marker: `{po}:layout`, the key layout version
    /// that writes this namespace (`Permits::prepare` writes and checks it).
    pub fn marker(&self) -> String {
        format!("{{{}}}:layout", self.namespace)
    }

    /// The event record of one event in a shard:
    /// `{po:3}:event:<biz_type>:<biz_id>` ([`Layout::record_name`] after
    /// `event:`), a hash holding the event's texts (`e<n>`, what its
    /// channels share `m<n>`), each channel's payload (`p:<task id>`) and
    /// the digests it joined (`x:<task id>`); its `p:` and `x:` fields are
    /// also the event's index in this shard (layout 5). An event's channels
    /// land in different shards, so finding all its tasks reads this hash
    /// in every shard (see `docs/redis.md`).
    pub fn event_record(&self, shard: u16, biz_type: &str, biz_id: &str) -> String {
        format!(
            "{}:event:{}",
            self.tag(shard),
            record_name(biz_type, biz_id)
        )
    }

    /// A fresh task id in `shard`: `<shard>-<ms since epoch><64 random bits>`,
    /// both numbers in base 62 of fixed width (8 and 11 digits), so ids of one
    /// shard sort by the time they were made. 21 bytes for shard 3 where
    /// decimal and hex took 34: an id is written about six times per open
    /// permit (permit, task key, stream entry, event record, event index).
    pub(crate) fn new_task_id(&self, shard: u16) -> String {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let mut id = format!("{shard}-");
        push_base62(&mut id, ms, 8);
        push_base62(&mut id, rand::random::<u64>(), 11);
        id
    }
}

/// Appends `n` in base 62 (`0-9A-Za-z`, ASCII order), `width` digits with
/// leading zeros (the lowest `width` digits when `n` needs more).
fn push_base62(out: &mut String, mut n: u64, width: usize) {
    const DIGITS: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut digits = vec![b'0'; width];
    for d in digits.iter_mut().rev() {
        *d = DIGITS[(n % 62) as usize];
        n /= 62;
    }
    out.extend(digits.iter().map(|&d| d as char));
}

/// The name of an event's record after `event:`: `<biz_type>:<biz_id>`.
/// A task names its event text by it (`ev`: `<n>:<name>`).
pub(crate) fn record_name(biz_type: &str, biz_id: &str) -> String {
    format!("{biz_type}:{biz_id}")
}

/// The segments of a composed key's body (`push:<policy>@<major>:<channel>:<body>`,
/// split at `:`); none for a key of another shape.
fn body_segments(key: &str) -> impl Iterator<Item = &str> {
    let body = key
        .strip_prefix("push:")
        .and_then(|rest| rest.splitn(3, ':').nth(2))
        .unwrap_or("");
    body.split(':').filter(|s| !s.is_empty())
}

/// Whether `key` names `user`: the user's encoded part ([`key_part`]) is a
/// whole `:`-separated segment of the key's body. Every seed key policy
/// that keys by user writes the user this way; a key that names no user
/// (`per-tenant-per-hour`) does not.
pub fn names_recipient(key: &str, user: &str) -> bool {
    let part = key_part(user);
    body_segments(key).any(|s| s == part)
}

/// A value as a key part, exactly as the key policies' `key_util::part`
/// writes it (`plugins/key-util`; the Python and JavaScript policies carry
/// the same encoding): bytes of `[A-Za-z0-9._@/-]` kept, every other byte
/// `+XX`, and a part that would be empty or longer than 64 bytes is `=`
/// and the first 32 hex digits of its SHA-256.
pub fn key_part(value: &str) -> String {
    const MAX_PART: usize = 64;
    let mut out = String::with_capacity(value.len());
    for &b in value.as_bytes() {
        if out.len() > MAX_PART {
            break;
        }
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'@' | b'/' | b'-') {
            out.push(b as char);
        } else {
            out.push_str(&format!("+{b:02X}"));
        }
    }
    if out.is_empty() || out.len() > MAX_PART {
        let digest = Sha256::digest(value.as_bytes());
        let mut hashed = String::with_capacity(33);
        hashed.push('=');
        for b in &digest[..16] {
            hashed.push_str(&format!("{b:02x}"));
        }
        hashed
    } else {
        out
    }
}

/// The shard a task id names (its prefix up to the first `-`), if it is well formed.
pub fn shard_of_task(task_id: &str) -> Option<u16> {
    task_id.split_once('-')?.0.parse().ok()
}

/// How many hex digits of a key's SHA-1 name its permit (116 bits; `lib.lua`'s
/// `PERMIT_DIGITS` is the same). With the default namespace the name
/// (`{po:15}:permit:` and these) is 44 bytes, so Redis keeps it in a
/// 48-byte allocation; 32 digits took a 64-byte one, and 16 bytes more for
/// every permit a delivered message keeps for its window (measured on a
/// scratch `redis-server` 7.0: 209 → 193 bytes of `used_memory` a permit).
/// Two keys of one shard and window share a permit only if 116 bits of
/// their digests collide.
pub const PERMIT_DIGITS: usize = 29;

/// What names a key's permit: the first [`PERMIT_DIGITS`] hex digits of the
/// key's SHA-1, as `lib.lua`'s `permit_name` computes it with
/// `redis.sha1hex`. A permit is the one key every accepted message keeps
/// for its window, so its name does not grow with the key (business and
/// user ids of any length); the task keeps the key itself.
pub fn permit_digest(key: &str) -> String {
    let mut hex = sha1_smol::Sha1::from(key).digest().to_string();
    hex.truncate(PERMIT_DIGITS);
    hex
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `printf %s 'push:per-event@1:sms:ORDER_SHIPPED:o-1:u-42' | sha1sum`
    const SHA1_OF_KEY: &str = "dc6178330247c2b3c3994fe2c77d2eaa566b2b29";

    #[test]
    fn a_permit_is_named_by_the_keys_sha1_whatever_its_length() {
        let key = "push:per-event@1:sms:ORDER_SHIPPED:o-1:u-42";
        assert_eq!(permit_digest(key), SHA1_OF_KEY[..PERMIT_DIGITS]);
        // The default namespace's longest tag keeps the name in 48 bytes.
        assert!(Layout::new("po", 16).permit_in(15, key).len() <= 44);
        let layout = Layout::new("po", 16);
        let long = format!("{key}:{}", "x".repeat(500));
        assert_eq!(
            layout.permit_in(3, &long).len(),
            layout.permit_in(3, key).len()
        );
        assert_ne!(layout.permit_in(3, &long), layout.permit_in(3, key));
    }

    #[test]
    fn keys_of_one_permit_share_a_tag() {
        let layout = Layout::new("po", 16);
        let key = "push:per-event@1:sms:ORDER_SHIPPED:o-1:u-42";
        let shard = layout.shard_for(key, Some("u-42"));
        assert_eq!(shard, layout.recipient_shard("u-42"));
        let id = layout.new_task_id(shard);
        let tag = layout.tag(shard);
        assert!(layout.permit(key, Some("u-42")).starts_with(&tag));
        assert!(layout.cap("c", "u-42:sms", "u-42").starts_with(&tag));
        assert!(layout.task(&id).unwrap().starts_with(&tag));
        assert!(layout.ready(shard).starts_with(&tag));
        assert!(layout.delayed(shard).starts_with(&tag));
        assert!(layout.awaiting(shard).starts_with(&tag));
        assert_eq!(shard_of_task(&id), Some(shard));
    }

    #[test]
    fn task_ids_are_short_and_sort_by_time() {
        let layout = Layout::new("po", 16);
        let a = layout.new_task_id(3);
        assert_eq!(a.len(), "3-".len() + 19, "{a}");
        let mut early = String::new();
        push_base62(&mut early, 1_718_000_000_000, 8);
        let mut late = String::new();
        push_base62(&mut late, 1_718_000_000_001, 8);
        assert!(early < late, "{early} {late}");
        let mut max = String::new();
        push_base62(&mut max, u64::MAX, 11);
        assert_eq!(max, "LygHa16AHYF");
    }

    #[test]
    fn shards_are_stable_and_spread() {
        let layout = Layout::new("po", 16);
        assert_eq!(layout.shard_of("a"), layout.shard_of("a"));
        let used: std::collections::HashSet<u16> = (0..200)
            .map(|i| layout.shard_of(&format!("k{i}")))
            .collect();
        assert_eq!(used.len(), 16);
    }

    #[test]
    fn the_recipient_is_a_whole_segment_of_the_body() {
        let key = "push:per-event@1:sms:ORDER:o-1:u-42";
        assert!(names_recipient(key, "u-42"));
        assert!(!names_recipient(key, "u-4"));
        assert!(!names_recipient(key, "sms"), "the channel is not the body");
        assert!(!names_recipient(key, "per-event@1"));
        assert!(names_recipient(
            "push:per-user-per-job@1:email:John+20Doe:job=7",
            "John Doe"
        ));
        // A key that names no user keeps the shard of the key.
        let tenant = "push:per-tenant-per-hour@1:sms:tenant=acme:2026-12-03T04";
        assert!(!names_recipient(tenant, "u-42"));
        let layout = Layout::new("po", 16);
        assert_eq!(
            layout.shard_for(tenant, Some("u-42")),
            layout.shard_of(tenant)
        );
        assert_eq!(layout.shard_for(key, None), layout.shard_of(key));
        // Keys of other shapes name nobody.
        assert!(!names_recipient("u-42", "u-42"));
    }

    #[test]
    fn key_part_matches_key_util() {
        // The vectors of plugins/key-util's own tests.
        assert_eq!(key_part("u-42"), "u-42");
        assert_eq!(key_part("John Doe"), "John+20Doe");
        assert_eq!(key_part("a:b"), "a+3Ab");
        assert_eq!(key_part("é"), "+C3+A9");
        assert!(key_part("").starts_with('='));
        assert_eq!(key_part(&"x".repeat(64)), "x".repeat(64));
        let long = key_part(&"x".repeat(65));
        assert_eq!(long.len(), 33);
        assert!(long.starts_with('='));
    }

    #[test]
    fn a_permit_is_among_the_candidate_shards_of_its_key() {
        let layout = Layout::new("po", 16);
        for i in 0..200 {
            let user = format!("user {i}");
            let key = format!("push:per-event@1:sms:ORDER:o-{i}:{}", key_part(&user));
            let shards = layout.candidate_shards(&key);
            assert!(shards.contains(&layout.shard_for(&key, Some(&user))));
            assert!(shards.contains(&layout.shard_of(&key)));
            assert!(shards.len() <= 4);
        }
    }
}
