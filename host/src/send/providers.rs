//! Providers within a channel: when an attempt's outcome at one provider
//! lets the next provider of the channel take the message over.
//!
//! A channel may name provider instances (`providers = ["sms-aliyun",
//! "sms-tencent"]`, each an ordinary single-plugin channel instance). A task
//! starts at the first and moves to the next only on a [`Handover::NotTaken`]:
//! the provider provably did not take the message, for a reason that is the
//! provider's or the account's own, not the recipient's. Anything else stays
//! with its provider (retried there, settled there by its query, or held),
//! because the next provider sending a message the first may have taken is a
//! second SMS to the user, and a per-number limit or an opt-out honoured by
//! one provider must not be undone by another.
//!
//! "Not taken" is derived from what the host already has, no new contract:
//! - the host's own outbound log: every request of the attempt failed before
//!   it was written (connect, TLS, refused by the outbound policy), and the
//!   plugin answered retryable — nothing reached the provider;
//! - or the plugin's classification (retryable or permanent: both mean "not
//!   accepted" in `wit/channel.wit`) with the provider's own code, which the
//!   SDK writes after `refused the message: ` (`channel_sdk::provider::refused`),
//!   found in the plugin's declared list of provider-wide refusals
//!   ([`provider_wide`]: credentials, arrears, unapproved sign or template,
//!   the provider's own API throttle), each cited in docs/providers.md.
//!
//! Unknown outcomes never hand over; per-number limits, invalid numbers,
//! opt-outs and blocklists are not in any list.

use super::SendOutcome;

/// Whether the next provider of a channel may take a message over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handover {
    /// The outcome stays with its provider (sent, unknown, or refused for a
    /// reason another provider must not undo).
    Stays,
    /// The provider did not take the message, for a reason of its own: the
    /// next provider may send it. The text says why, for the task's history.
    NotTaken(&'static str),
}

/// Where the SDK puts the provider's code in a refusal's text.
const CODE_AFTER: &str = "refused the message: ";

/// Refusals of `plugin`'s provider that are the provider's or the account's,
/// never the recipient's (docs/providers.md, "Failover between providers").
/// Exact codes, or prefixes ending in `.` or `*`.
pub fn provider_wide(plugin: &str) -> &'static [&'static str] {
    match plugin {
        "aliyun-sms" => &[
            // Credentials and permissions.
            "SignatureDoesNotMatch",
            "IncompleteSignature",
            "InvalidAccessKeyId*",
            "Forbidden*",
            "isp.RAM_PERMISSION_DENY",
            // Arrears.
            "isv.AMOUNT_NOT_ENOUGH",
            "isv.OUT_OF_SERVICE",
            // Sign and template approval are per account.
            "isv.SMS_TEMPLATE_ILLEGAL",
            "isv.SMS_SIGNATURE_ILLEGAL",
            "isv.SMS_SIGN_ILLEGAL",
        ],
        "tencent-sms" => &[
            // Credentials, application, allowlist.
            "AuthFailure.SignatureFailure",
            "AuthFailure.SecretIdNotFound",
            "AuthFailure.InvalidSecretId",
            "AuthFailure.UnauthorizedOperation",
            "UnauthorizedOperation.SmsSdkAppIdVerifyFail",
            "UnauthorizedOperation.SdkAppIdIsDisabled",
            "InvalidParameterValue.SdkAppIdNotExist",
            "UnauthorizedOperation.RequestIpNotInWhitelist",
            // Arrears.
            "UnauthorizedOperation.SerivceSuspendDueToArrears",
            "FailedOperation.InsufficientBalanceInSmsPackage",
            // Sign and template approval are per account.
            "FailedOperation.SignatureIncorrectOrUnapproved",
            "FailedOperation.TemplateIncorrectOrUnapproved",
            "FailedOperation.TemplateUnapprovedOrNotExist",
            // The API's own request rate (per account), not the number's.
            "RequestLimitExceeded*",
        ],
        _ => &[],
    }
}

/// The provider's code in a refusal's text, if the SDK wrote one.
pub fn refusal_code(reason: &str) -> Option<&str> {
    let rest = &reason[reason.find(CODE_AFTER)? + CODE_AFTER.len()..];
    let code = rest
        .split(|c: char| c.is_whitespace() || matches!(c, '(' | ',' | ';'))
        .next()?;
    (!code.is_empty()).then_some(code)
}

/// Whether `code` is on `list` (exact, or under a `*` prefix).
fn listed(list: &[&str], code: &str) -> bool {
    list.iter().any(|entry| match entry.strip_suffix('*') {
        Some(prefix) => code.starts_with(prefix),
        None => *entry == code,
    })
}

/// Whether the next provider may take over after `outcome` of `plugin`
/// (its name, e.g. `aliyun-sms`); `written`: whether a request of the
/// attempt may have reached the provider (the host's outbound log).
pub fn handover(plugin: &str, outcome: &SendOutcome, written: bool) -> Handover {
    let reason = match outcome {
        SendOutcome::Sent { .. } | SendOutcome::Unknown(_) => return Handover::Stays,
        SendOutcome::Retryable { .. } if !written => {
            return Handover::NotTaken("no request reached the provider");
        }
        SendOutcome::Retryable { reason, .. } | SendOutcome::Permanent(reason) => reason,
    };
    match refusal_code(reason) {
        Some(code) if listed(provider_wide(plugin), code) => {
            Handover::NotTaken("the provider refused it for a reason of its own")
        }
        _ => Handover::Stays,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn permanent(code: &str) -> SendOutcome {
        SendOutcome::Permanent(format!("Aliyun SMS refused the message: {code} (why)"))
    }

    #[test]
    fn credentials_and_arrears_hand_over_numbers_and_limits_stay() {
        for code in [
            "SignatureDoesNotMatch",
            "isv.AMOUNT_NOT_ENOUGH",
            "InvalidAccessKeyId.NotFound",
        ] {
            assert!(
                matches!(
                    handover("aliyun-sms", &permanent(code), true),
                    Handover::NotTaken(_)
                ),
                "{code}"
            );
        }
        for code in [
            "isv.MOBILE_NUMBER_ILLEGAL",
            "isv.BLACK_KEY_CONTROL_LIMIT",
            "isv.BUSINESS_LIMIT_CONTROL",
            "isv.DAY_LIMIT_CONTROL",
        ] {
            assert_eq!(
                handover("aliyun-sms", &permanent(code), true),
                Handover::Stays,
                "{code}"
            );
        }
        let limit = SendOutcome::retryable(
            "Tencent Cloud (SendSms) refused the message: LimitExceeded.PhoneNumberDailyLimit",
        );
        assert_eq!(handover("tencent-sms", &limit, true), Handover::Stays);
        let blocked = SendOutcome::Permanent(
            "Tencent Cloud (SendSms) refused the message: FailedOperation.PhoneNumberInBlacklist"
                .into(),
        );
        assert_eq!(handover("tencent-sms", &blocked, true), Handover::Stays);
        for code in [
            "FailedOperation.SignatureIncorrectOrUnapproved",
            "FailedOperation.TemplateIncorrectOrUnapproved",
            "FailedOperation.TemplateUnapprovedOrNotExist",
        ] {
            let unapproved = SendOutcome::Permanent(format!(
                "Tencent Cloud (SendSms) refused the message: {code}"
            ));
            assert!(
                matches!(
                    handover("tencent-sms", &unapproved, true),
                    Handover::NotTaken(_)
                ),
                "{code}: approval is per account, the next provider may have it"
            );
        }
        let throttled = SendOutcome::retryable(
            "Tencent Cloud (SendSms) refused the message: RequestLimitExceeded",
        );
        assert!(matches!(
            handover("tencent-sms", &throttled, true),
            Handover::NotTaken(_)
        ));
    }

    #[test]
    fn unknown_never_hands_over_and_an_unwritten_retry_does() {
        let unknown = SendOutcome::Unknown(
            "Tencent Cloud (SendSms) refused the message: AuthFailure.SignatureFailure".into(),
        );
        assert_eq!(handover("tencent-sms", &unknown, false), Handover::Stays);
        let refused_connect = SendOutcome::retryable("connection refused");
        assert!(matches!(
            handover("webhook", &refused_connect, false),
            Handover::NotTaken(_)
        ));
        assert_eq!(
            handover("webhook", &refused_connect, true),
            Handover::Stays,
            "an unlisted plugin's refusal after a write stays"
        );
    }
}
