//! Channel plugin `ses-email`: email through Amazon SES API v2, contract 2.2
//! (world `channel-plugin-extras`: the host's unsubscribe link comes with
//! every send). Facts and sources: docs/providers.md, "Amazon SES".
//!
//! Send: `SendEmail` (<https://docs.aws.amazon.com/ses/latest/APIReference-V2/API_SendEmail.html>),
//! `POST /v2/email/outbound-emails` signed with SigV4 (service `ses`,
//! `provider_auth::aws::sigv4`), to the message's recipient, with the stored
//! template the message names (`Content.Template { TemplateName,
//! TemplateData }`, the parameters as a JSON object). `Template` takes
//! `Headers` (<https://docs.aws.amazon.com/ses/latest/APIReference-V2/API_Template.html>,
//! added 2024-03-05): a message with an unsubscribe link carries
//! `List-Unsubscribe: <url>` and `List-Unsubscribe-Post:
//! List-Unsubscribe=One-Click` (RFC 8058). `channel.send` (no extras) sends
//! without them. 200 is sent (provider id = `MessageId`); refusals follow
//! `provider_auth::aws::ses::classify` (a 5xx unknown, 429 /
//! `TooManyRequestsException` / `LimitExceededException` retryable, the
//! content, identity and account refusals permanent).
//!
//! Capabilities, true of SES:
//! - `honours_reference = false`: `SendEmail` has no idempotency token or
//!   client reference (its request fields: docs/providers.md); the same
//!   request twice is two emails.
//! - `can_query = false`: SES API v2 has no per-message status lookup (its
//!   outcome arrives only as notifications).
//! - `callbacks = true`: SES notifications through an SNS HTTPS
//!   subscription (<https://docs.aws.amazon.com/ses/latest/dg/notification-contents.html>),
//!   each signed by SNS and verified here (`callback`).
//!
//! Not sent after a `MessageId` (1.1.0): SES answers `SendEmail` 200 even
//! when the template data lacks a variable the template uses, then does not
//! send the email; the only word of it is a `Rendering Failure` event
//! (<https://repost.aws/knowledge-center/ses-sendtemplatedemail-delivery-failure>),
//! and of a virus found, a `Reject` event
//! (<https://docs.aws.amazon.com/ses/latest/APIReference-V2/API_EventDestination.html>),
//! both published only through a configuration set's event destination
//! (<https://docs.aws.amazon.com/ses/latest/dg/event-publishing-retrieving-sns-contents.html>),
//! never through the identity's notifications. Either settles the message
//! `failed` (failed for good, SES's reason in the detail) and opts nobody
//! out. Without `configuration_set` naming a set
//! whose SNS destination includes them, such an email stays `sent` forever.

mod bindings;
mod callback;
mod cert;
mod send;
mod settings;

use bindings::exports::pushonce::channel::callbacks::{CallbackOutcome, Guest as CallbacksGuest};
use bindings::exports::pushonce::channel::channel::Guest as ChannelGuest;
use bindings::exports::pushonce::channel::extras::{Guest as ExtrasGuest, MessageExtras};
use channel_sdk::provider::auth::aws::ses::one_click_headers;
use channel_sdk::{
    CallbackAnswer, CallbackError, CallbackRequest, DeliveryStatus, Message, PluginInfo,
    ProviderCapabilities, Receipt, SendError, SentMessage,
};

/// The plugin.
struct SesEmail;

impl bindings::Guest for SesEmail {
    fn describe() -> PluginInfo {
        channel_sdk::plugin_info!()
    }
}

impl ChannelGuest for SesEmail {
    fn capabilities() -> ProviderCapabilities {
        ProviderCapabilities {
            honours_reference: false,
            can_query: false,
            callbacks: true,
            ..ProviderCapabilities::NONE
        }
    }

    fn send(msg: Message) -> Result<Receipt, SendError> {
        send::send(&msg, &[])
    }

    fn query(_msg: SentMessage) -> Result<DeliveryStatus, SendError> {
        Err(SendError::Permanent(
            "Amazon SES has no per-message status query".into(),
        ))
    }

    fn handle_callback(req: CallbackRequest) -> Result<CallbackAnswer, CallbackError> {
        callback::handle(req).map(|o| CallbackAnswer {
            settlements: o.settlements,
            reply: o.reply,
        })
    }
}

impl CallbacksGuest for SesEmail {
    fn handle_callback(req: CallbackRequest) -> Result<CallbackOutcome, CallbackError> {
        callback::handle(req)
    }
}

impl ExtrasGuest for SesEmail {
    fn send(msg: Message, extras: MessageExtras) -> Result<Receipt, SendError> {
        let headers = match &extras.unsubscribe {
            Some(link) if link.url.contains(['\r', '\n', '<', '>']) => {
                return Err(SendError::Permanent(
                    "the unsubscribe link is not a URL a header can carry".into(),
                ));
            }
            Some(link) => one_click_headers(&link.url),
            None => Vec::new(),
        };
        send::send(&msg, &headers)
    }
}

bindings::export!(SesEmail with_types_in bindings);
