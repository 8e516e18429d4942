//! Redis over TLS with an ACL user: a real `redis-server` with `--tls-port`
//! only (`--port 0`), its certificate issued by a CA made here with rcgen,
//! and a user `pushonce` with a password. A `pushonce serve` on
//! `rediss://pushonce:<password>@127.0.0.1:<port>` with `PUSHONCE_REDIS_CA_FILE`
//! accepts an event; a wrong password is refused without being shown.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use pushonce::store::{RedisTarget, Store, free_loopback_port, open_tls_client};
use pushonce_tests::host::order_shipped;
use pushonce_tests::process::PushonceProcess;
use pushonce_tests::wait_until;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

const PASSWORD: &str = "acl-pass-7f3k";

/// A TLS-only `redis-server` with an ACL user; killed when dropped.
struct TlsRedis {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl TlsRedis {
    async fn start() -> TlsRedis {
        let dir = tempfile::tempdir().unwrap();
        write_certificates(dir.path());
        let port = free_loopback_port().unwrap();
        let p = |name: &str| dir.path().join(name);
        let child = Command::new("redis-server")
            .args(["--port", "0", "--bind", "127.0.0.1"])
            .args(["--tls-port", &port.to_string()])
            .arg("--tls-cert-file")
            .arg(p("server.pem"))
            .arg("--tls-key-file")
            .arg(p("server.key"))
            .arg("--tls-ca-cert-file")
            .arg(p("ca.pem"))
            .args([
                "--tls-auth-clients",
                "no",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args([
                "--user",
                "pushonce",
                "on",
                &format!(">{PASSWORD}"),
                "~*",
                "&*",
                "+@all",
            ])
            .args(["--user", "default", "off"])
            .arg("--logfile")
            .arg(p("redis.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (apt-get install redis-server)");
        let server = TlsRedis { child, port, dir };
        let (url, ca) = (server.url(PASSWORD), server.ca());
        wait_until(Duration::from_secs(20), || {
            let (url, ca) = (url.clone(), ca.clone());
            async move { ping(&url, &ca).await.is_ok() }
        })
        .await
        .unwrap_or_else(|e| panic!("{e}: {}", server.log()));
        server
    }

    fn url(&self, password: &str) -> String {
        format!("rediss://pushonce:{password}@127.0.0.1:{}", self.port)
    }

    fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }
}

/// A CA, and a certificate for 127.0.0.1 and localhost it issued.
fn write_certificates(dir: &Path) {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "pushonce test CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let server_params =
        CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    let server_key = KeyPair::generate().unwrap();
    let server_cert = server_params.signed_by(&server_key, &issuer).unwrap();
    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
    std::fs::write(dir.join("server.pem"), server_cert.pem()).unwrap();
    std::fs::write(dir.join("server.key"), server_key.serialize_pem()).unwrap();
}

async fn ping(url: &str, ca: &Path) -> anyhow::Result<()> {
    let client = open_tls_client(url, ca)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let _: String = redis::cmd("PING").query_async(&mut conn).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_refused_and_not_shown() {
    let redis = TlsRedis::start().await;
    let target = RedisTarget::TlsUrl {
        url: redis.url("wrong-secret-9q"),
        ca_file: redis.ca(),
    };
    let err = match Store::open(&target).await {
        Ok(store) => store.manager().await.map(|_| ()).unwrap_err(),
        Err(e) => e,
    };
    let text = format!("{err} {err:?}");
    assert!(!text.contains("wrong-secret-9q"), "{text}");
    // Without the CA the server's certificate is not trusted.
    let untrusted = redis::Client::open(redis.url(PASSWORD)).unwrap();
    assert!(untrusted.get_multiplexed_async_connection().await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_on_rediss_with_an_acl_user_accepts_an_event() {
    let redis = TlsRedis::start().await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_loopback_port().unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let (url, ca) = (redis.url(PASSWORD), redis.ca());
    let env = [
        ("PUSHONCE_REDIS_URL", url.as_str()),
        ("PUSHONCE_REDIS_CA_FILE", ca.to_str().unwrap()),
        ("RUST_LOG", "debug"),
    ];
    let listen = format!("127.0.0.1:{port}");
    let host = PushonceProcess::serve_repository_config(dir.path(), &listen, "", &env).unwrap();
    host.wait_ready(&base, Duration::from_secs(60))
        .await
        .unwrap();
    let answer = reqwest::Client::new()
        .post(format!("{base}/v1/events"))
        .json(&order_shipped("o-tls"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 202, "{}", host.log());
    let body: serde_json::Value = answer.json().await.unwrap();
    assert_eq!(body["results"].as_array().unwrap().len(), 3, "{body}");
    assert!(
        !host.log().contains(PASSWORD),
        "the password is never logged"
    );
}
