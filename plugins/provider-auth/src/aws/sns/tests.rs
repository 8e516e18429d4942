//! SNS signatures checked against a certificate made for the test (the
//! RFC 7515 A.2 RSA key, self-signed with `openssl req -x509`): each
//! message type, both signature versions, and what a forger changes.

use super::*;
use base64::engine::general_purpose::STANDARD;

const KEY: &str = include_str!("../../../tests/data/rfc7515-a2-rsa.pem");
const CERT: &str = include_str!("../../../tests/data/sns-test-cert.pem");
const ENDPOINT: &str = "https://sns.us-east-1.amazonaws.com";

/// Signs `fields` as SNS does and returns the message body.
fn signed(mut fields: serde_json::Value, version: &str) -> Vec<u8> {
    use rsa::pkcs8::DecodePrivateKey;
    fields["SignatureVersion"] = version.into();
    fields["Signature"] = "".into();
    fields["SigningCertURL"] =
        format!("{ENDPOINT}/SimpleNotificationService-0123456789abcdef.pem").into();
    let msg = parse(fields.to_string().as_bytes()).unwrap();
    let key = rsa::PrivateKey::from_pkcs8_pem(KEY).unwrap();
    let data = msg.string_to_sign();
    let sig = match version {
        "1" => key.pkcs1v15_sign::<sha1::Sha1>(data.as_bytes()),
        _ => key.pkcs1v15_sign::<sha2::Sha256>(data.as_bytes()),
    }
    .unwrap();
    fields["Signature"] = STANDARD.encode(sig).into();
    fields.to_string().into_bytes()
}

fn notification() -> serde_json::Value {
    serde_json::json!({
        "Type": "Notification",
        "MessageId": "22b80b92-fdea-4c2c-8f9d-bdfb0c7bf324",
        "TopicArn": "arn:aws:sns:us-west-2:123456789012:MyTopic",
        "Subject": "My First Message",
        "Message": "Hello world!",
        "Timestamp": "2012-05-02T00:54:06.655Z",
        "UnsubscribeURL": "https://sns.us-west-2.amazonaws.com/?Action=Unsubscribe&SubscriptionArn=arn:aws:sns:us-west-2:123456789012:MyTopic:c9135db0"
    })
}

fn confirmation() -> serde_json::Value {
    serde_json::json!({
        "Type": "SubscriptionConfirmation",
        "MessageId": "165545c9-2a5c-472c-8df2-7ff2be2b3b1b",
        "Token": "2336412f37",
        "TopicArn": "arn:aws:sns:us-west-2:123456789012:MyTopic",
        "Message": "You have chosen to subscribe to the topic arn:aws:sns:us-west-2:123456789012:MyTopic.\nTo confirm the subscription, visit the SubscribeURL included in this message.",
        "SubscribeURL": "https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription&TopicArn=arn:aws:sns:us-west-2:123456789012:MyTopic&Token=2336412f37",
        "Timestamp": "2012-04-26T20:45:04.751Z"
    })
}

#[test]
fn string_to_sign_as_documented() {
    let n = parse(&signed(notification(), "1")).unwrap();
    assert_eq!(
        n.string_to_sign(),
        "Message\nHello world!\nMessageId\n22b80b92-fdea-4c2c-8f9d-bdfb0c7bf324\nSubject\nMy First Message\nTimestamp\n2012-05-02T00:54:06.655Z\nTopicArn\narn:aws:sns:us-west-2:123456789012:MyTopic\nType\nNotification\n"
    );
    let mut no_subject = notification();
    no_subject.as_object_mut().unwrap().remove("Subject");
    let n = parse(&signed(no_subject, "1")).unwrap();
    assert!(!n.string_to_sign().contains("Subject"));
    let c = parse(&signed(confirmation(), "1")).unwrap();
    assert_eq!(c.kind, Kind::SubscriptionConfirmation);
    assert!(c.string_to_sign().starts_with("Message\nYou have chosen"));
    assert!(c.string_to_sign().ends_with(
        "SubscribeURL\nhttps://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription&TopicArn=arn:aws:sns:us-west-2:123456789012:MyTopic&Token=2336412f37\nTimestamp\n2012-04-26T20:45:04.751Z\nToken\n2336412f37\nTopicArn\narn:aws:sns:us-west-2:123456789012:MyTopic\nType\nSubscriptionConfirmation\n"
    ));
}

#[test]
fn both_versions_verify() {
    for version in ["1", "2"] {
        for body in [notification(), confirmation()] {
            let msg = parse(&signed(body, version)).unwrap();
            assert_eq!(verify(&msg, CERT), Ok(()), "version {version}");
        }
    }
}

#[test]
fn forgeries_are_refused() {
    let good = parse(&signed(notification(), "2")).unwrap();
    let mut altered = good.clone();
    altered.message = "Hello world?".into();
    assert_eq!(verify(&altered, CERT), Err(SnsError::BadSignature));
    let mut resigned = good.clone();
    resigned.signature.replace_range(0..4, "AAAA");
    assert_eq!(verify(&resigned, CERT), Err(SnsError::BadSignature));
    // A version-2 signature read as version 1 does not verify either.
    let mut downgraded = good.clone();
    downgraded.signature_version = "1".into();
    assert_eq!(verify(&downgraded, CERT), Err(SnsError::BadSignature));
    let mut v3 = good;
    v3.signature_version = "3".into();
    assert_eq!(
        verify(&v3, CERT),
        Err(SnsError::UnsupportedVersion("3".into()))
    );
    assert!(matches!(
        verify(&parse(&signed(notification(), "1")).unwrap(), "not a cert"),
        Err(SnsError::BadCertificate(_))
    ));
}

#[test]
fn malformed_messages_name_the_field() {
    assert_eq!(
        parse(br#"{"Type":"Notification"}"#),
        Err(SnsError::Malformed("`MessageId` is missing".into()))
    );
    assert!(matches!(parse(b"{"), Err(SnsError::Malformed(_))));
    let mut c = confirmation();
    c.as_object_mut().unwrap().remove("SubscribeURL");
    c["SignatureVersion"] = "1".into();
    c["Signature"] = "x".into();
    c["SigningCertURL"] = "https://x".into();
    assert_eq!(
        parse(c.to_string().as_bytes()),
        Err(SnsError::Malformed("`SubscribeURL` is missing".into()))
    );
}

#[test]
fn urls_must_be_https_under_the_endpoint() {
    let ok = |u: &str| check_url("SigningCertURL", u, ENDPOINT);
    assert_eq!(
        ok("https://sns.us-east-1.amazonaws.com/SimpleNotificationService-1.pem"),
        Ok(())
    );
    assert!(ok("http://sns.us-east-1.amazonaws.com/x.pem").is_err());
    assert!(ok("https://evil.example/x.pem").is_err());
    assert!(ok("https://sns.us-east-1.amazonaws.com.evil.example/x.pem").is_err());
    assert!(ok("https://sns.us-east-1.amazonaws.com@evil.example/x.pem").is_err());
    let under = |u: &str| check_url("SubscribeURL", u, "https://127.0.0.1:9090/sns");
    assert_eq!(under("https://127.0.0.1:9090/sns/?Action=x"), Ok(()));
    assert_eq!(under("https://127.0.0.1:9090/sns?Action=x"), Ok(()));
    assert!(under("https://127.0.0.1:9090/snsx").is_err());
    assert!(under("https://127.0.0.1:9091/sns/").is_err());
}
