//! What a task's channel sends, stored in the task as JSON (`payload`):
//! written at accept, read by the senders, and read here for the fallback
//! a failure triggers. The lifecycle owns the type because it decides the
//! fallback; `send` re-exports it for the senders.

/// What a task's channel sends: the contract between the API (which writes it
/// into the task at accept, as JSON in `payload`) and the senders (which read it).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Payload {
    /// The address on this channel: phone number, WeChat openid, device token, inbox user.
    pub recipient: String,
    /// The template (code or id) the provider renders.
    pub template: String,
    /// Template parameters, in order.
    #[serde(default)]
    pub params: Vec<(String, String)>,
    /// The channel plugin `name@version` resolved at accept: an in-flight task
    /// keeps the plugin version it started with. `None` before channel plugins.
    #[serde(default)]
    pub plugin: Option<String>,
    /// Where to send instead if this channel fails for good (absent when
    /// none: the payload is kept in Redis while the task is open).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<Box<Fallback>>,
    /// The recipient's one-click unsubscribe link, written at accept for a
    /// channel whose plugin takes extras (contract 2.2, e.g. email) when the
    /// host has `[unsubscribe]` settings; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unsubscribe: Option<UnsubscribeLink>,
}

/// A signed link that switches a category (or, without one, the channel)
/// off for the message's recipient (`crate::unsubscribe`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnsubscribeLink {
    /// The link's URL (`.../v1/unsubscribe/{token}`).
    pub url: String,
    /// The category it switches off; `None`: the channel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
}

/// A fallback task, fully derived at accept so the dispatcher needs no policy
/// lookup: the channel is in the key, so the fallback has a key of its own.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fallback {
    /// The backup channel.
    pub channel: String,
    /// Its idempotency key.
    pub key: String,
    /// Its dedup window, in ms.
    pub window_ms: u64,
    /// What it sends.
    pub payload: Payload,
    /// The category of the event's policy (`None`: none): a recipient who
    /// switched it (or the channel) off since the accept gets no fallback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
}

/// A task's `payload` that does not parse: the task cannot be sent (its
/// attempt is refused for good, as the sender would refuse it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the task's payload is not valid: {0}")]
pub struct InvalidPayload(pub String);

/// A task's payload parsed at its first use and shared after it, so that
/// one delivery parses it once (its send, its fallback, its status query).
#[derive(Default, Clone)]
pub(crate) struct ParsedPayload(
    std::sync::OnceLock<Result<std::sync::Arc<Payload>, InvalidPayload>>,
);

/// A digest's items as its message carries them: how many events it
/// gathered and the first `max_items` of them (a JSON array of
/// `{"biz_id", "params"}` objects, in the order they joined).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DigestItems<'a> {
    /// How many events the digest gathered.
    pub(crate) count: &'a str,
    /// The items kept, as JSON array text.
    pub(crate) items: &'a str,
    /// The business id of the event that opened the digest.
    pub(crate) opener: &'a str,
}

/// The parameter naming how many events a digest gathered.
pub const DIGEST_COUNT: &str = "digest_count";
/// The parameter holding a digest's first items (JSON array text).
pub const DIGEST_ITEMS: &str = "digest_items";

impl Payload {
    /// This payload as a digest's message: its own parameters (those of the
    /// event that opened the digest, so a channel that knows nothing of
    /// digests sends the first item; once that event was cancelled out of
    /// the digest, those of the first item it still carries) followed by
    /// `digest_count` and `digest_items`.
    fn with_digest(mut self, digest: DigestItems<'_>) -> Payload {
        if let Some(params) = digest.first_params() {
            self.params = params;
        }
        self.params
            .push((DIGEST_COUNT.to_string(), digest.count.to_string()));
        self.params
            .push((DIGEST_ITEMS.to_string(), digest.items.to_string()));
        self
    }
}

impl DigestItems<'_> {
    /// The parameters of the first item kept, when it is not the opening
    /// event (that one was taken out: `cancel.lua`), in the order a
    /// payload holds an event's parameters (by name).
    fn first_params(&self) -> Option<Vec<(String, String)>> {
        #[derive(serde::Deserialize)]
        struct Item {
            biz_id: String,
            params: std::collections::BTreeMap<String, String>,
        }
        let items: Vec<Item> = serde_json::from_str(self.items).ok()?;
        let first = items.into_iter().next()?;
        (first.biz_id != self.opener).then(|| first.params.into_iter().collect())
    }
}

impl ParsedPayload {
    /// `text` parsed (as a digest's message when `digest`), the first time;
    /// the same answer after.
    pub(crate) fn get(
        &self,
        text: &str,
        digest: Option<DigestItems<'_>>,
    ) -> Result<std::sync::Arc<Payload>, InvalidPayload> {
        self.0
            .get_or_init(|| {
                serde_json::from_str::<Payload>(text)
                    .map(|p| match digest {
                        Some(d) => p.with_digest(d),
                        None => p,
                    })
                    .map(std::sync::Arc::new)
                    .map_err(|e| InvalidPayload(e.to_string()))
            })
            .clone()
    }
}

/// A cache of the text beside it: two tasks are equal by their fields.
impl PartialEq for ParsedPayload {
    fn eq(&self, _: &ParsedPayload) -> bool {
        true
    }
}

impl std::fmt::Debug for ParsedPayload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ParsedPayload")
    }
}
