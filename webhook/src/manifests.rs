//! The deployment manifests: the Helm chart under `deploy/helm/tessera`, compiled into the
//! binary and rendered with `template`'s Helm subset. `tessera manifests` prints them, so
//! the chart is the one source of both install paths.

use serde_yaml::{Mapping, Value};

use crate::template::{self, Context, TemplateError};

/// Path of the chart in the repository, for messages and the drift test.
pub const CHART_DIR: &str = "deploy/helm/tessera";

/// The chart's values, as shipped.
pub const VALUES_YAML: &str = include_str!("../../deploy/helm/tessera/values.yaml");
const CHART_YAML: &str = include_str!("../../deploy/helm/tessera/Chart.yaml");

/// The chart's templates in the order they are printed (namespace first, so that
/// `kubectl apply -f -` creates it before what lives in it). A test checks this list
/// against the chart directory.
pub const TEMPLATES: &[(&str, &str)] = &[
    (
        "namespace.yaml",
        include_str!("../../deploy/helm/tessera/templates/namespace.yaml"),
    ),
    (
        "node-config.yaml",
        include_str!("../../deploy/helm/tessera/templates/node-config.yaml"),
    ),
    (
        "node-rbac.yaml",
        include_str!("../../deploy/helm/tessera/templates/node-rbac.yaml"),
    ),
    (
        "daemonset.yaml",
        include_str!("../../deploy/helm/tessera/templates/daemonset.yaml"),
    ),
    (
        "webhook-rbac.yaml",
        include_str!("../../deploy/helm/tessera/templates/webhook-rbac.yaml"),
    ),
    (
        "cert-manager.yaml",
        include_str!("../../deploy/helm/tessera/templates/cert-manager.yaml"),
    ),
    (
        "webhook.yaml",
        include_str!("../../deploy/helm/tessera/templates/webhook.yaml"),
    ),
    (
        "webhook-config.yaml",
        include_str!("../../deploy/helm/tessera/templates/webhook-config.yaml"),
    ),
    (
        "servicemonitor.yaml",
        include_str!("../../deploy/helm/tessera/templates/servicemonitor.yaml"),
    ),
];

/// Files in `templates/` that Helm does not render as manifests.
pub const NOT_MANIFESTS: &[&str] = &["NOTES.txt"];

/// Why the manifests could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error("{what} is not valid YAML: {source}")]
    Yaml {
        what: String,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("--set {0:?}: expected KEY=VALUE with a dotted key, like webhook.replicas=3")]
    BadSet(String),
    #[error("{what} must be a YAML mapping at the top")]
    NotAMapping { what: String },
}

/// What to render.
#[derive(Debug, Clone)]
pub struct RenderOptions {
    pub release_name: String,
    pub namespace: String,
    /// Values files, lowest priority first: (name for messages, YAML text).
    pub values_files: Vec<(String, String)>,
    /// `key.path=value` overrides, applied after the files, like `helm --set`.
    pub set: Vec<String>,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self {
            release_name: "tessera".into(),
            namespace: "tessera-system".into(),
            values_files: Vec::new(),
            set: Vec::new(),
        }
    }
}

fn parse_yaml(what: &str, text: &str) -> Result<Value, ManifestError> {
    let v: Value = serde_yaml::from_str(text).map_err(|source| ManifestError::Yaml {
        what: what.to_string(),
        source,
    })?;
    match v {
        Value::Mapping(_) => Ok(v),
        // An empty values file is allowed, as in Helm.
        Value::Null => Ok(Value::Mapping(Mapping::new())),
        _ => Err(ManifestError::NotAMapping {
            what: what.to_string(),
        }),
    }
}

/// Helm's merge: maps merge key by key, anything else is replaced.
fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Mapping(b), Value::Mapping(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(existing) => merge(existing, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

/// `a.b.c=value` as a nested map; the value is typed like `helm --set` does for the
/// simple cases (true/false, integers, null), else a string.
fn set_to_value(s: &str) -> Result<Value, ManifestError> {
    let (key, raw) = s
        .split_once('=')
        .ok_or_else(|| ManifestError::BadSet(s.into()))?;
    if key.is_empty() || key.split('.').any(str::is_empty) {
        return Err(ManifestError::BadSet(s.into()));
    }
    let mut v = match raw {
        "true" => Value::Bool(true),
        "false" => Value::Bool(false),
        "null" => Value::Null,
        _ => match raw.parse::<i64>() {
            Ok(n) if !raw.starts_with('0') || raw == "0" => Value::Number(n.into()),
            _ => Value::String(raw.into()),
        },
    };
    for part in key.rsplit('.') {
        let mut m = Mapping::new();
        m.insert(Value::String(part.into()), v);
        v = Value::Mapping(m);
    }
    Ok(v)
}

/// The values the templates see: the chart's, then each file, then each `--set`.
pub fn values(opts: &RenderOptions) -> Result<Value, ManifestError> {
    let mut v = parse_yaml(&format!("{CHART_DIR}/values.yaml"), VALUES_YAML)?;
    for (name, text) in &opts.values_files {
        merge(&mut v, parse_yaml(name, text)?);
    }
    for s in &opts.set {
        merge(&mut v, set_to_value(s)?);
    }
    Ok(v)
}

/// Renders every template; returns the manifests as one multi-document YAML stream.
pub fn render(opts: &RenderOptions) -> Result<String, ManifestError> {
    let chart = parse_yaml(&format!("{CHART_DIR}/Chart.yaml"), CHART_YAML)?;
    let field = |k: &str| {
        chart
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let ctx = Context {
        values: values(opts)?,
        release_name: opts.release_name.clone(),
        release_namespace: opts.namespace.clone(),
        chart_name: field("name"),
        chart_version: field("version"),
        app_version: field("appVersion"),
    };
    let mut out = String::new();
    for (name, text) in TEMPLATES {
        let path = format!("{CHART_DIR}/templates/{name}");
        let rendered = template::render(&path, text, &ctx)?;
        if rendered.trim().is_empty() {
            continue;
        }
        out.push_str("---\n# Source: tessera/templates/");
        out.push_str(name);
        out.push('\n');
        out.push_str(rendered.trim_matches('\n'));
        out.push('\n');
    }
    Ok(out)
}

/// What `tessera manifests` prints: the chart with a Namespace object of its own, since
/// `kubectl apply` has no `--create-namespace`.
pub fn render_standalone(opts: &RenderOptions) -> Result<String, ManifestError> {
    let mut opts = opts.clone();
    opts.set.insert(0, "createNamespace=true".to_string());
    render(&opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_values_are_typed_like_helm() {
        let v = set_to_value("a.b=3").expect("ok");
        assert_eq!(v["a"]["b"], Value::Number(3.into()));
        assert_eq!(set_to_value("x=true").expect("ok")["x"], Value::Bool(true));
        assert_eq!(
            set_to_value("x=007").expect("ok")["x"],
            Value::String("007".into())
        );
        assert_eq!(
            set_to_value("image.tag=v1.2").expect("ok")["image"]["tag"],
            Value::String("v1.2".into())
        );
        for bad in ["novalue", "=x", "a..b=1"] {
            let e = set_to_value(bad).unwrap_err().to_string();
            assert!(e.contains("KEY=VALUE"), "{e}");
        }
    }

    #[test]
    fn files_and_sets_override_in_order() {
        let opts = RenderOptions {
            values_files: vec![(
                "mine.yaml".into(),
                "webhook: {replicas: 3, port: 9443}\n".into(),
            )],
            set: vec!["webhook.replicas=5".into()],
            ..RenderOptions::default()
        };
        let v = values(&opts).expect("values");
        assert_eq!(v["webhook"]["replicas"], Value::Number(5.into()));
        assert_eq!(v["webhook"]["port"], Value::Number(9443.into()));
        // Siblings from the chart's own values survive a partial override.
        assert_eq!(v["webhook"]["timeoutSeconds"], Value::Number(10.into()));
    }

    #[test]
    fn bad_values_files_are_named() {
        let opts = RenderOptions {
            values_files: vec![("broken.yaml".into(), "webhook: [".into())],
            ..RenderOptions::default()
        };
        let e = values(&opts).unwrap_err().to_string();
        assert!(e.starts_with("broken.yaml is not valid YAML"), "{e}");
        let opts = RenderOptions {
            values_files: vec![("list.yaml".into(), "- a\n".into())],
            ..RenderOptions::default()
        };
        let e = values(&opts).unwrap_err().to_string();
        assert!(e.contains("list.yaml must be a YAML mapping"), "{e}");
    }
}
