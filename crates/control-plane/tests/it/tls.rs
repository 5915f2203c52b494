//! The control plane terminating TLS itself (`--tls-cert`/`--tls-key`),
//! driven by curl verifying a certificate made in the test (rcgen).

use std::process::Command;

use crate::process::{DEV_TOKEN, start_with};
use crate::support;

fn curl(args: &[&str]) -> (bool, String, String) {
    let out = Command::new("curl")
        .args(["--silent", "--show-error", "--max-time", "20"])
        .args(args)
        .output()
        .expect("curl runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn curl_uploads_and_lists_over_tls_with_a_private_ca() {
    let dir = tempfile::tempdir().unwrap();
    let key =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()]).unwrap();
    let cert_path = dir.path().join("cert.pem");
    let key_path = dir.path().join("key.pem");
    std::fs::write(&cert_path, key.cert.pem()).unwrap();
    std::fs::write(&key_path, key.signing_key.serialize_pem()).unwrap();
    let wasm = dir.path().join("api.wasm");
    std::fs::write(&wasm, support::wasm_module("api")).unwrap();
    let (_db_dir, db) = support::sqlite();
    let (c, k) = (cert_path.to_str().unwrap(), key_path.to_str().unwrap());
    let cp = start_with(&db, &["--tls-cert", c, "--tls-key", k]);
    assert!(cp.http.starts_with("https://127.0.0.1:"), "{}", cp.http);

    let (ok, body, err) = curl(&["--cacert", c, &format!("{}/healthz", cp.http)]);
    assert!(ok, "{err}");
    assert_eq!(body, "ok\n");
    let auth = format!("Authorization: Bearer {DEV_TOKEN}");
    let (ok, body, err) = curl(&[
        "--cacert",
        c,
        "-H",
        &auth,
        "--data-binary",
        &format!("@{}", wasm.display()),
        &format!("{}/v1/accounts/dev/scripts/api/versions", cp.http),
    ]);
    assert!(ok, "{err}");
    let uploaded: edgeprof_proto::rest::UploadedVersion = serde_json::from_str(&body).unwrap();
    assert_eq!(uploaded.script, "api");
    let (ok, body, err) = curl(&[
        "--cacert",
        c,
        "-H",
        &auth,
        &format!("{}/v1/accounts/dev/scripts", cp.http),
    ]);
    assert!(ok, "{err}");
    let list: edgeprof_proto::rest::ScriptList = serde_json::from_str(&body).unwrap();
    assert_eq!(list.scripts[0].name, "api");
    // Without the CA the certificate is not trusted; plain HTTP is not served.
    let (ok, _, err) = curl(&[&format!("{}/healthz", cp.http)]);
    assert!(!ok && err.to_lowercase().contains("certificate"), "{err}");
    let plain = cp.http.replace("https://", "http://");
    let (ok, body, _) = curl(&[&format!("{plain}/healthz")]);
    assert!(!ok || body != "ok\n", "plain HTTP answered on the TLS port");
}

#[test]
fn a_key_that_is_not_a_key_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("cert.pem");
    let key = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    std::fs::write(&cert, key.cert.pem()).unwrap();
    let bad = dir.path().join("key.pem");
    std::fs::write(&bad, "not a key").unwrap();
    let (_db_dir, db) = support::sqlite();
    let out = Command::new(env!("CARGO_BIN_EXE_edgeprof-control-plane"))
        .args(["--database", &db, "--dev", "--http-listen", "127.0.0.1:0"])
        .args(["--grpc-listen", "127.0.0.1:0", "--tls-cert"])
        .arg(&cert)
        .arg("--tls-key")
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "--tls-key {}: cannot read a PEM private key",
            bad.display()
        )),
        "{err}"
    );
}
