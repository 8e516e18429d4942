//! "No panic on any input" for the key derivation: arbitrary events,
//! channels and parameters through the real key-policy plugins. Every call
//! answers a key the host accepts or an error; none panics or traps the host.
//! (The event parser and the policy loader have their own property tests
//! in `host/src/derive.rs` and `host/src/route/policy.rs`.)

use std::sync::{Arc, LazyLock};

use proptest::prelude::*;
use pushonce::derive::{DeriveError, derive, validate_body};
use pushonce::event::Event;
use pushonce::plugin::KeyPolicyPlugin;
use pushonce_tests::plugins::real_registry;

/// The three real key policies, loaded once for every case.
static POLICIES: LazyLock<Vec<Arc<KeyPolicyPlugin>>> = LazyLock::new(|| {
    let registry = real_registry(None);
    ["per-event", "per-user-per-day", "per-user-per-job"]
        .iter()
        .map(|name| registry.resolve_key_policy(name).expect(name))
        .collect()
});

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[A-Za-z0-9_:+-]{0,12}",
        "[+-][0-9]{2}:[0-9]{2}",
        Just(String::new()),
    ]
}

prop_compose! {
    fn event()(
        biz_type in text(), biz_id in text(), user_id in text(),
        occurred_at_ms in any::<u64>(),
        attributes in proptest::collection::vec((text(), text()), 0..4),
    ) -> Event {
        Event { biz_type, biz_id, user_id, occurred_at_ms, attributes }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn any_event_channel_and_params_give_a_valid_key_or_an_error(
        event in event(),
        channel in prop_oneof![text(), Just("sms".to_string())],
        params in proptest::collection::vec((prop_oneof![text(), Just("tz".into()), Just("job_attr".into())], text()), 0..3),
    ) {
        for policy in POLICIES.iter() {
            match derive(policy, &event, &channel, &params) {
                Ok(k) => {
                    let body = k.key.rsplit_once(&format!(":{channel}:")).map(|(_, b)| b);
                    prop_assert!(body.is_some_and(|b| validate_body(b).is_ok()), "{}", k.key);
                }
                Err(DeriveError::Call(_) | DeriveError::BadChannel { .. } | DeriveError::BadKey { .. }) => {}
            }
        }
    }
}
