//! Reading the daemons' YAML config files (the manager's and the device
//! plugin's), so that both report a bad file the same way: the field's path as
//! the file spells it (`default.slice.slicesPerGpu`, `gpuClasses[0].name`),
//! what is wrong, and the line and column, on one line that fits a log.
//!
//! Behind the `yaml` feature: the shim links this crate and reads no YAML.
//! The parser is `serde-saphyr` (pure Rust, maintained; `serde_yaml` is
//! deprecated); `serde_path_to_error` records the path while it deserializes,
//! which the parser alone reports only as a line.

use std::fmt;

use serde::de::DeserializeOwned;

/// A config text that is not valid YAML or does not fit the expected shape.
#[derive(Debug)]
pub struct YamlError {
    /// Where in the document, e.g. `default.slice.slicesPerGpu`; empty at the
    /// top level.
    pub path: String,
    /// The parser's message, with the line and column where it knows them.
    pub message: String,
}

impl fmt::Display for YamlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl std::error::Error for YamlError {}

/// Parses one YAML document as `T`. `Ok(None)` when the document is empty:
/// nothing, only comments, or a bare null (`~`), which callers treat as "no
/// settings" or refuse, as fits them.
///
/// # Errors
/// A syntax error, an unknown field (with `deny_unknown_fields`), a missing
/// one, a wrong type, or more than one document.
pub fn from_yaml<T: DeserializeOwned>(text: &str) -> Result<Option<T>, YamlError> {
    let mut options = serde_saphyr::Options::default();
    // The default adds a multi-line source excerpt; a config error goes to a
    // log line and a Kubernetes event, where the line and column suffice.
    options.with_snippet = false;
    let mut path = String::new();
    serde_saphyr::with_deserializer_from_str_with_options(text, options, |de| {
        serde_path_to_error::deserialize(de).map_err(|e| {
            path = e.path().to_string();
            e.into_inner()
        })
    })
    .map_err(|e| YamlError {
        // `serde_path_to_error` spells the top level ".".
        path: if path == "." { String::new() } else { path },
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Top {
        inner: Option<Inner>,
        items: Option<Vec<Item>>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Inner {
        slices_per_gpu: Option<u32>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Item {
        name: String,
    }

    fn err(text: &str) -> String {
        from_yaml::<Top>(text).expect_err("refused").to_string()
    }

    #[test]
    fn parses_a_document() {
        let t: Top = from_yaml("inner:\n  slicesPerGpu: 4\nitems: [{name: a}]\n")
            .expect("parses")
            .expect("not empty");
        assert_eq!(
            t.inner,
            Some(Inner {
                slices_per_gpu: Some(4)
            })
        );
        assert_eq!(t.items, Some(vec![Item { name: "a".into() }]));
    }

    #[test]
    fn empty_documents_are_none() {
        for text in ["", "\n  \n", "# only a comment\n", "~\n", "null\n"] {
            assert_eq!(from_yaml::<Top>(text).expect("parses"), None, "{text:?}");
        }
    }

    #[test]
    fn errors_name_the_path_and_the_line_on_one_line() {
        let e = err("inner:\n  slicesPerGpu: eight\n");
        assert!(e.starts_with("inner.slicesPerGpu: "), "{e}");
        assert!(e.contains("line 2"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        let e = err("inner:\n  slicesPerGPU: 8\n");
        assert!(
            e.starts_with("inner.slicesPerGPU: ") && e.contains("unknown field"),
            "{e}"
        );
        let e = err("items:\n  - name: a\n  - {}\n");
        assert!(e.starts_with("items[1]: ") && e.contains("name"), "{e}");
        let e = err("inner: [unclosed\n");
        assert!(e.contains("line 1"), "{e}");
    }

    #[test]
    fn top_level_errors_have_no_path_prefix() {
        let e = err("- a\n- b\n");
        assert!(!e.starts_with(':') && !e.starts_with('.'), "{e}");
        let e = err("inner: {}\n---\ninner: {}\n");
        assert!(!e.is_empty(), "a second document is refused");
    }
}
