//! A control plane terminating TLS itself with a certificate made here
//! (`rcgen`: a private CA and a server certificate for 127.0.0.1), and both
//! the CLI and `curl` running a capture against it, verifying the
//! certificate; without the CA both refuse the connection.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cp::{Running, functions};

/// A private CA and a server certificate it signed for 127.0.0.1 and
/// localhost, as PEM files in `dir`: (CA, server chain, server key).
fn certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "edgeprof test CA");
    let ca = rcgen::CertifiedIssuer::self_signed(ca, rcgen::KeyPair::generate().unwrap()).unwrap();
    let mut server =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .unwrap();
    server
        .distinguished_name
        .push(rcgen::DnType::CommonName, "edgeprof control plane");
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = server.signed_by(&key, &ca).unwrap();
    let write = |name: &str, pem: String| {
        let p = dir.join(name);
        std::fs::write(&p, pem).unwrap();
        p
    };
    (
        write("ca.pem", ca.pem()),
        write("server.pem", cert.pem()),
        write("server.key", key.serialize_pem()),
    )
}

#[test]
fn cli_and_curl_capture_over_tls_with_a_private_ca() {
    let certs = tempfile::tempdir().unwrap();
    let (ca, cert, key) = certificates(certs.path());
    // The control plane's `--tls-cert/--tls-key`.
    let mut running = Running::start_with(
        |config| {
            config.tls = Some(edgeprof_control_plane::server::TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
            })
        },
        "https",
    );
    let ca_flag = ca.to_str().unwrap();
    // Without the CA: the connection flags alone.
    let no_ca = running.conn.clone();
    running
        .conn
        .extend(["--ca-cert".to_owned(), ca_flag.to_owned()]);

    // Deploy and capture through the CLI, over TLS, verified by the CA.
    running.serve_api();
    let out = running.dir.path().join("cli.pprof");
    let session = running.capture(&out);
    assert_eq!(session.status, edgeprof_proto::rest::SessionStatus::Done);
    assert!(functions(&out).contains(&"work_i1".to_owned()));

    // The CA from the environment works the same.
    let mut args = vec!["sessions", "--json"];
    args.extend(no_ca.iter().map(String::as_str));
    let env = Command::new(env!("CARGO_BIN_EXE_edgeprof"))
        .args(&args)
        .env("EDGEPROF_CA_CERT", &ca)
        .output()
        .unwrap();
    assert!(env.status.success(), "{env:?}");
    let list: edgeprof_proto::rest::SessionList = serde_json::from_slice(&env.stdout).unwrap();
    assert_eq!(list.profiles.len(), 1);

    // curl: the synchronous capture route answers the profile itself.
    let url = &running.conn[1];
    let token = &running.conn[3];
    let curl_out = running.dir.path().join("curl.pprof");
    let headers = running.dir.path().join("curl.headers");
    let curl = Command::new("curl")
        .args(["--silent", "--show-error", "--fail", "--cacert", ca_flag])
        .args([
            "-X",
            "POST",
            "-H",
            &format!("authorization: Bearer {token}"),
        ])
        .args(["-H", "content-type: application/json"])
        .args(["--data", r#"{"duration_ms": 1000}"#])
        .arg("-o")
        .arg(&curl_out)
        .arg("-D")
        .arg(&headers)
        .arg(format!(
            "{url}/v1/accounts/acme/scripts/api/versions/latest/profile"
        ))
        .output()
        .expect("cannot start curl");
    assert!(
        curl.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&curl.stderr)
    );
    let headers = std::fs::read_to_string(&headers).unwrap().to_lowercase();
    assert!(headers.contains("x-edgeprof-status: done"), "{headers}");
    assert!(functions(&curl_out).contains(&"work_i1".to_owned()));

    // Without the CA, the certificate is refused: one line naming why.
    let mut args = vec!["sessions"];
    args.extend(no_ca.iter().map(String::as_str));
    let run = crate::support::edgeprof(&args);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    let line = run.stderr.trim_end();
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(
        line.contains("cannot reach the control plane") && line.contains("UnknownIssuer"),
        "{line}"
    );
    let curl = Command::new("curl")
        .args(["--silent", "--fail", &format!("{url}/healthz")])
        .output()
        .unwrap();
    // 60: "Peer certificate cannot be authenticated with known CA certificates".
    assert_eq!(curl.status.code(), Some(60), "{curl:?}");
    // A file that holds no certificate is named.
    args.extend(["--ca-cert", key.to_str().unwrap()]);
    let run = crate::support::edgeprof(&args);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains("holds no PEM certificate"),
        "{}",
        run.stderr
    );
}
