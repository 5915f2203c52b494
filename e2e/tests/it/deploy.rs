//! `deploy/` as shipped, checked against the binaries themselves: every
//! variable the Containerfiles and environment examples set is one the
//! binary reads (its `--help`); the images listen on all interfaces on
//! exactly the ports they expose and carry the dashboard; the default ports
//! of every listener differ on one host and the defaults point at each
//! other; the systemd units pass `systemd-analyze verify` where it exists.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use edgeprof_e2e::cluster::default_bin_dir;

use crate::root;

/// The binary `name`, or `None` (after printing why) outside CI when it
/// is not built.
fn binary(name: &str) -> Option<PathBuf> {
    let path = default_bin_dir().join(name);
    if path.is_file() {
        return Some(path);
    }
    let why = format!("needs {} (run `cargo build --bins`)", path.display());
    if std::env::var_os("CI").is_some() {
        panic!("{why}");
    }
    eprintln!("skipping: {why}");
    None
}

/// The `EDGEPROF_*` variables `name --help` lists, with their defaults.
fn variables(name: &str) -> Option<BTreeMap<String, Option<String>>> {
    let out = Command::new(binary(name)?).arg("--help").output().unwrap();
    assert!(out.status.success(), "{name} --help failed");
    let text = String::from_utf8(out.stdout).unwrap();
    let mut vars = BTreeMap::new();
    for line in text.lines() {
        let Some((_, rest)) = line.split_once("[env: ") else {
            continue;
        };
        let var: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let default = line
            .split_once("[default: ")
            .and_then(|(_, d)| d.split_once(']'))
            .map(|(d, _)| d.to_owned());
        vars.insert(var, default);
    }
    assert!(!vars.is_empty(), "no [env: …] in {name} --help:\n{text}");
    Some(vars)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every `EDGEPROF_*` name in `text`.
fn mentioned(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("EDGEPROF_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        out.insert(name);
    }
    out
}

/// A Containerfile's `ENV` assignments (continuation lines joined) and
/// `EXPOSE`d ports.
fn container(path: &str) -> (BTreeMap<String, String>, BTreeSet<u16>, String) {
    let text = read(path);
    let joined = text.replace("\\\n", " ");
    let mut env = BTreeMap::new();
    let mut exposed = BTreeSet::new();
    for line in joined.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("ENV ") {
            for kv in rest.split_whitespace() {
                let (k, v) = kv
                    .split_once('=')
                    .unwrap_or_else(|| panic!("{path}: ENV `{kv}` is not KEY=VALUE"));
                env.insert(k.to_owned(), v.to_owned());
            }
        } else if let Some(rest) = line.strip_prefix("EXPOSE ") {
            exposed.extend(rest.split_whitespace().map(|p| {
                p.parse::<u16>()
                    .unwrap_or_else(|_| panic!("{path}: EXPOSE `{p}`"))
            }));
        }
    }
    (env, exposed, text)
}

/// `KEY=VALUE` lines of an environment example.
fn env_file(path: &str) -> BTreeMap<String, String> {
    read(path)
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

fn port(addr: &str) -> u16 {
    addr.rsplit_once(':')
        .and_then(|(_, p)| p.trim_end_matches('/').parse().ok())
        .unwrap_or_else(|| panic!("`{addr}` has no port"))
}

const BINARIES: [(&str, &str); 2] = [
    ("edgeprof-control-plane", "control-plane"),
    ("edgeprof-node-agent", "node-agent"),
];

#[test]
fn deploy_files_set_only_variables_the_binaries_read() {
    for (bin, dir) in BINARIES {
        let Some(vars) = variables(bin) else { return };
        for file in [
            format!("deploy/{dir}/Containerfile"),
            format!("deploy/{dir}/{dir}.env.example"),
        ] {
            let unknown: Vec<String> = mentioned(&read(&file))
                .into_iter()
                .filter(|v| !vars.contains_key(v))
                .collect();
            assert!(
                unknown.is_empty(),
                "{file} names {unknown:?}, which `{bin} --help` does not read"
            );
        }
    }
}

#[test]
fn images_listen_on_all_interfaces_on_the_ports_they_expose() {
    for (bin, dir) in BINARIES {
        let Some(vars) = variables(bin) else { return };
        let file = format!("deploy/{dir}/Containerfile");
        let (env, exposed, text) = container(&file);
        let listeners: Vec<&String> = vars.keys().filter(|k| k.ends_with("_LISTEN")).collect();
        let mut ports = BTreeSet::new();
        for var in listeners {
            let value = env
                .get(var)
                .unwrap_or_else(|| panic!("{file} leaves {var} at its loopback default"));
            assert!(
                value.starts_with("0.0.0.0:"),
                "{file}: {var}={value} is not on all interfaces"
            );
            ports.insert(port(value));
        }
        assert_eq!(exposed, ports, "{file}: EXPOSE and the listeners");
        assert!(
            text.contains(&format!("ENTRYPOINT [\"/usr/local/bin/{bin}\"]")),
            "{file} runs {bin}"
        );
    }
    // The control plane's image serves the dashboard from what it copied in.
    let file = "deploy/control-plane/Containerfile";
    let (env, _, text) = container(file);
    let dir = env
        .get("EDGEPROF_DASHBOARD_DIR")
        .unwrap_or_else(|| panic!("{file} sets no EDGEPROF_DASHBOARD_DIR"));
    assert!(
        text.contains("cargo xtask dist")
            && text.contains(&format!("COPY --from=build /src/target/dist {dir}")),
        "{file} builds the dashboard and copies it to {dir}"
    );
    let ignore = read(".dockerignore");
    assert!(
        ignore.lines().any(|l| l.trim() == "target/"),
        ".dockerignore keeps target/ out of the build context"
    );
}

#[test]
fn default_ports_differ_on_one_host_and_point_at_each_other() {
    let (Some(cp), Some(agent), Some(cli)) = (
        variables("edgeprof-control-plane"),
        variables("edgeprof-node-agent"),
        variables("edgeprof"),
    ) else {
        return;
    };
    let default = |vars: &BTreeMap<String, Option<String>>, var: &str| {
        port(
            vars.get(var)
                .and_then(Option::as_deref)
                .unwrap_or_else(|| panic!("{var} has no default")),
        )
    };
    let listeners = [
        ("control plane REST", default(&cp, "EDGEPROF_HTTP_LISTEN")),
        ("control plane gRPC", default(&cp, "EDGEPROF_GRPC_LISTEN")),
        ("agent HTTP", default(&agent, "EDGEPROF_HTTP_LISTEN")),
        (
            "agent operator",
            default(&agent, "EDGEPROF_OPERATOR_LISTEN"),
        ),
        ("agent gRPC", default(&agent, "EDGEPROF_GRPC_LISTEN")),
    ];
    let distinct: BTreeSet<u16> = listeners.iter().map(|(_, p)| *p).collect();
    assert_eq!(distinct.len(), listeners.len(), "{listeners:?}");
    assert_eq!(
        default(&agent, "EDGEPROF_CONTROL_PLANE"),
        default(&cp, "EDGEPROF_GRPC_LISTEN"),
        "the agent's default control plane is the control plane's default gRPC port"
    );
    assert_eq!(
        default(&cli, "EDGEPROF_URL"),
        default(&cp, "EDGEPROF_HTTP_LISTEN"),
        "the CLI's default URL is the control plane's default REST port"
    );
    // The examples agree with each other and with the images.
    let cp_env = env_file("deploy/control-plane/control-plane.env.example");
    let agent_env = env_file("deploy/node-agent/node-agent.env.example");
    assert_eq!(
        port(&agent_env["EDGEPROF_CONTROL_PLANE"]),
        port(&cp_env["EDGEPROF_GRPC_LISTEN"])
    );
    for (dir, example) in [("control-plane", &cp_env), ("node-agent", &agent_env)] {
        let (image, _, _) = container(&format!("deploy/{dir}/Containerfile"));
        for (var, value) in image.iter().filter(|(k, _)| k.ends_with("_LISTEN")) {
            if let Some(e) = example.get(var) {
                assert_eq!(
                    port(e),
                    port(value),
                    "{dir}: {var} in the example and the image"
                );
            }
        }
    }
}

#[test]
fn systemd_units_pass_systemd_analyze_verify() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipping: no systemd-analyze on this machine");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (bin, name) in BINARIES {
        let Some(path) = binary(bin) else { return };
        let unit = format!("{bin}.service");
        // The unit as installed, its binary where this build put it.
        let text = read(&format!("deploy/{name}/{unit}"))
            .replace(&format!("/usr/local/bin/{bin}"), path.to_str().unwrap());
        let file = dir.path().join(&unit);
        std::fs::write(&file, text).unwrap();
        let out = Command::new("systemd-analyze")
            .arg("verify")
            .arg(&file)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let about_unit: Vec<&str> = stderr.lines().filter(|l| l.contains(&unit)).collect();
        assert!(
            out.status.success() && about_unit.is_empty(),
            "systemd-analyze verify {unit}: {stderr}"
        );
    }
}

/// Where a manifest's environment variable comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    /// `value: …`
    Value(String),
    /// `valueFrom:` a secret's `key` or a `fieldPath`.
    From(String),
}

/// The `EDGEPROF_*` environment of a Kubernetes manifest's container, the
/// `containerPort`s by name, and the Services' `targetPort`s.
struct Manifest {
    env: BTreeMap<String, Source>,
    container_ports: BTreeMap<String, u16>,
    target_ports: BTreeSet<String>,
}

fn manifest(path: &str) -> Manifest {
    let text = read(path);
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let unquote = |s: &str| s.trim().trim_matches('"').to_owned();
    let mut m = Manifest {
        env: BTreeMap::new(),
        container_ports: BTreeMap::new(),
        target_ports: BTreeSet::new(),
    };
    for (i, line) in lines.iter().enumerate() {
        if let Some(name) = line.strip_prefix("- name: ") {
            let next = lines.get(i + 1).copied().unwrap_or("");
            if name.starts_with("EDGEPROF_") {
                let source = if let Some(v) = next.strip_prefix("value:") {
                    Source::Value(unquote(v))
                } else {
                    assert_eq!(next, "valueFrom:", "{path}: {name} has no value");
                    let from = lines[i + 2..]
                        .iter()
                        .take(3)
                        .find_map(|l| l.strip_prefix("key: ").or(l.strip_prefix("fieldPath: ")))
                        .unwrap_or_else(|| panic!("{path}: {name}: valueFrom what?"));
                    Source::From(from.to_owned())
                };
                m.env.insert(name.to_owned(), source);
            } else if let Some(p) = next.strip_prefix("containerPort: ") {
                m.container_ports
                    .insert(name.to_owned(), p.trim().parse().unwrap());
            }
        } else if let Some(p) = line.strip_prefix("targetPort: ") {
            m.target_ports.insert(p.trim().to_owned());
        }
    }
    m
}

/// `deploy/kubernetes/`: each container sets only variables its binary
/// reads, listens on all interfaces on exactly its declared ports (those
/// of its image), the Services target declared ports, the agents find the
/// control plane's gRPC Service, and the environment passes the binary's
/// own `--check-config` (secrets and fields filled in as Kubernetes would).
#[test]
fn kubernetes_manifests_match_the_binaries_and_their_images() {
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("k8s.sqlite");
    let filled = |from: &str| -> String {
        match from {
            "agent-secret" => "a-long-agent-secret-for-the-test".into(),
            "database-url" => database.to_str().unwrap().into(),
            "spec.nodeName" => "node-1".into(),
            "status.podIP" => "10.0.0.7".into(),
            other => panic!("no test value for valueFrom {other}"),
        }
    };
    let mut grpc_service = None;
    for (bin, name, expected) in [
        (
            "edgeprof-control-plane",
            "control-plane",
            "edgeprof-control-plane: configuration OK",
        ),
        (
            "edgeprof-node-agent",
            "node-agent",
            "configuration ok: machine node-1 in lhr",
        ),
    ] {
        let Some(vars) = variables(bin) else { return };
        let file = format!("deploy/kubernetes/{name}.yaml");
        let m = manifest(&file);
        let unknown: Vec<&String> = m.env.keys().filter(|k| !vars.contains_key(*k)).collect();
        assert!(unknown.is_empty(), "{file}: {bin} reads no {unknown:?}");
        let mut listening = BTreeSet::new();
        for (var, source) in m.env.iter().filter(|(k, _)| k.ends_with("_LISTEN")) {
            let Source::Value(v) = source else {
                panic!("{file}: {var} from a secret?")
            };
            assert!(v.starts_with("0.0.0.0:"), "{file}: {var}={v}");
            listening.insert(port(v));
        }
        let declared: BTreeSet<u16> = m.container_ports.values().copied().collect();
        assert_eq!(listening, declared, "{file}: listeners and containerPorts");
        let (_, exposed, _) = container(&format!("deploy/{name}/Containerfile"));
        assert_eq!(declared, exposed, "{file} and its image's EXPOSE");
        for t in &m.target_ports {
            assert!(
                m.container_ports.contains_key(t),
                "{file}: a Service targets `{t}`, no container port has that name"
            );
        }
        if name == "control-plane" {
            grpc_service = m.container_ports.get("grpc").copied();
        } else {
            let Some(Source::Value(url)) = m.env.get("EDGEPROF_CONTROL_PLANE") else {
                panic!("{file} sets no EDGEPROF_CONTROL_PLANE")
            };
            assert!(
                url.starts_with("http://edgeprof-control-plane:"),
                "{file}: the agents reach the control plane's Service: {url}"
            );
            assert_eq!(Some(port(url)), grpc_service, "{file}: the gRPC port");
        }
        let env: Vec<(String, String)> = m
            .env
            .iter()
            .map(|(k, s)| match s {
                Source::Value(v) => (k.clone(), v.clone()),
                Source::From(f) => (k.clone(), filled(f)),
            })
            .collect();
        let out = Command::new(binary(bin).unwrap())
            .env_clear()
            .envs(env)
            .arg("--check-config")
            .output()
            .unwrap();
        // The control plane says so on stderr, the agent on stdout.
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success() && said.contains(expected),
            "{bin} --check-config with {file}'s environment: {said}"
        );
    }
}
