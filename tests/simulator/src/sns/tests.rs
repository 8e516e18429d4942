//! The simulated SNS signs as SNS does.

use super::*;

/// The documented order, `Subject` only when present; both versions
/// verify with the certificate's key and fail once the message changes.
#[test]
fn signs_as_sns() {
    use rsa::pkcs8::DecodePrivateKey;
    let sns = Sns::default();
    sns.set_base("https://127.0.0.1:1".into());
    let mut m = json!({"Type": "Notification", "MessageId": "i", "TopicArn": "t",
        "Message": "m", "Timestamp": "ts"});
    assert_eq!(
        string_to_sign(&m),
        "Message\nm\nMessageId\ni\nTimestamp\nts\nTopicArn\nt\nType\nNotification\n"
    );
    let (der, pem) = sns.key().unwrap();
    assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"));
    let public = rsa::PrivateKey::from_pkcs8_der(&der)
        .unwrap()
        .to_public_key();
    for version in [1, 2] {
        sign(&sns, &mut m, version).unwrap();
        let sig = base64::engine::general_purpose::STANDARD
            .decode(m["Signature"].as_str().unwrap())
            .unwrap();
        let data = string_to_sign(&m);
        let ok = match version {
            1 => public.pkcs1v15_verify::<sha1::Sha1>(data.as_bytes(), &sig),
            _ => public.pkcs1v15_verify::<rsa::sha2::Sha256>(data.as_bytes(), &sig),
        };
        assert!(ok.is_ok(), "version {version}");
        assert!(
            public
                .pkcs1v15_verify::<sha1::Sha1>(b"other", &sig)
                .is_err()
        );
    }
    assert!(
        sns.cert_url()
            .starts_with("https://127.0.0.1:1/sns/SimpleNotificationService-")
    );
    let name = sns.cert_url().rsplit('/').next().unwrap().to_string();
    assert_eq!(sns.cert_named(&name), Some(pem));
    assert_eq!(sns.cert_named("SimpleNotificationService-0.pem"), None);
}
