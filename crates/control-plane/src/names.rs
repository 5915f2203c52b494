//! Names parsed once at the edge (REST path or body, gRPC request) into
//! types that cannot hold an invalid value: [`AccountId`], [`ScriptName`]
//! and [`DurableObjectId`].
//!
//! Account ids and script names are DNS labels (lowercase letters, digits
//! and hyphens, 1–63 characters, no hyphen first or last), because the
//! ingress routes by host `{script}.{account}.{zone}`. Script names the
//! agent's own paths use (`healthz`, `metrics`, `debug`, `do`) are refused
//! at upload.
//!
//! Imports only [`crate::text`].

use crate::text::echo;

/// Why a name is refused: the field and the rule, for a 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct NameError {
    /// Machine-readable code (`invalid_name`, `reserved_name`,
    /// `invalid_durable_object`).
    pub code: &'static str,
    /// The field, as the request names it.
    pub field: String,
    /// The rule broken, quoting the value (bounded).
    pub message: String,
}

/// Longest DNS label.
pub const MAX_LABEL: usize = 63;
/// Script names the agent's HTTP ingress uses for itself.
pub const RESERVED_SCRIPT_NAMES: [&str; 4] = ["healthz", "metrics", "debug", "do"];

fn dns_label(field: &str, v: &str) -> Result<(), NameError> {
    let ok = !v.is_empty()
        && v.len() <= MAX_LABEL
        && v.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !v.starts_with('-')
        && !v.ends_with('-');
    if ok {
        return Ok(());
    }
    Err(NameError {
        code: "invalid_name",
        field: field.to_owned(),
        message: format!(
            "`{}` must be a DNS label: 1–{MAX_LABEL} lowercase letters, digits or hyphens, \
             not starting or ending with a hyphen",
            echo(v)
        ),
    })
}

macro_rules! label_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// The name as a string.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }
    };
}

label_type!(
    /// An account id: a DNS label.
    AccountId
);
label_type!(
    /// A script name: a DNS label.
    ScriptName
);

impl AccountId {
    /// Parses `v` given as `field`.
    pub fn parse(field: &str, v: &str) -> Result<Self, NameError> {
        dns_label(field, v)?;
        Ok(AccountId(v.to_owned()))
    }
}

impl ScriptName {
    /// Parses `v` given as `field` (a name to look up: reserved names
    /// parse, and are simply never found).
    pub fn parse(field: &str, v: &str) -> Result<Self, NameError> {
        dns_label(field, v)?;
        Ok(ScriptName(v.to_owned()))
    }

    /// Parses `v` as the name of a script to create: also refuses
    /// [`RESERVED_SCRIPT_NAMES`].
    pub fn parse_new(field: &str, v: &str) -> Result<Self, NameError> {
        let name = Self::parse(field, v)?;
        if RESERVED_SCRIPT_NAMES.contains(&v) {
            return Err(NameError {
                code: "reserved_name",
                field: field.to_owned(),
                message: format!(
                    "`{v}` is reserved for the node agent's own paths ({}); choose another name",
                    RESERVED_SCRIPT_NAMES.join(", ")
                ),
            });
        }
        Ok(name)
    }
}

/// A Durable Object: namespace and 64-hex id (stored lowercase), written
/// `namespace:id`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DurableObjectId {
    namespace: String,
    id: String,
}

/// Longest Durable Object namespace.
pub const MAX_NAMESPACE: usize = 64;

impl DurableObjectId {
    /// Parses a namespace (1–64 of A–Z, a–z, 0–9, `-`, `_`) given as
    /// `namespace_field` and an id (64 hex characters) given as `id_field`.
    pub fn parse(
        namespace_field: &str,
        namespace: &str,
        id_field: &str,
        id: &str,
    ) -> Result<Self, NameError> {
        let err = |field: &str, message: String| NameError {
            code: "invalid_durable_object",
            field: field.to_owned(),
            message,
        };
        if namespace.is_empty()
            || namespace.len() > MAX_NAMESPACE
            || !namespace
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        {
            return Err(err(
                namespace_field,
                format!(
                    "`{}` must be 1–{MAX_NAMESPACE} characters of A–Z, a–z, 0–9, `-`, `_`",
                    echo(namespace)
                ),
            ));
        }
        if id.len() != 64 || !id.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Err(err(
                id_field,
                format!(
                    "must be 64 hexadecimal characters (got {} characters: `{}`)",
                    id.chars().count(),
                    echo(id)
                ),
            ));
        }
        Ok(DurableObjectId {
            namespace: namespace.to_owned(),
            id: id.to_ascii_lowercase(),
        })
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The id, lowercase hex.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl std::fmt::Display for DurableObjectId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.namespace, self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        for ok in ["a", "api", "my-worker-2", &"a".repeat(63)] {
            assert!(ScriptName::parse("script", ok).is_ok(), "{ok}");
            assert!(AccountId::parse("account", ok).is_ok(), "{ok}");
        }
        for bad in ["", "Api", "a_b", "a b", "-a", "a-", "é", &"a".repeat(64)] {
            let e = ScriptName::parse("script", bad).unwrap_err();
            assert_eq!(e.code, "invalid_name");
            assert!(e.to_string().starts_with("script: `"), "{e}");
            assert!(e.message.contains("DNS label"), "{e}");
        }
        for reserved in RESERVED_SCRIPT_NAMES {
            assert!(ScriptName::parse("script", reserved).is_ok());
            let e = ScriptName::parse_new("script", reserved).unwrap_err();
            assert_eq!(e.code, "reserved_name");
            assert!(e.message.contains("reserved"), "{e}");
        }
    }

    #[test]
    fn durable_objects() {
        let id = "AB".repeat(32);
        let d = DurableObjectId::parse("namespace_id", "chat", "actor_id", &id).unwrap();
        assert_eq!(d.to_string(), format!("chat:{}", id.to_lowercase()));
        let e = DurableObjectId::parse("namespace_id", "", "actor_id", &id).unwrap_err();
        assert_eq!(e.field, "namespace_id");
        let e = DurableObjectId::parse("ns", "chat", "id", &"z".repeat(5000)).unwrap_err();
        assert!(e.message.len() < 200, "{e}");
        assert!(e.message.contains("got 5000 characters"), "{e}");
    }
}
