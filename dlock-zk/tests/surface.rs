//! The default public API holds no test hooks: every public `*_for_test` function of the crate
//! sits behind the `testing` cargo feature.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

/// Public `*_for_test` functions in `src` that are not gated by `cfg(feature = "testing")`.
fn ungated_hooks(src: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let l = line.trim_start();
            let is_hook = (l.starts_with("pub fn ") || l.starts_with("pub async fn "))
                && l.split('(')
                    .next()
                    .is_some_and(|sig| sig.ends_with("_for_test"));
            if !is_hook {
                continue;
            }
            // The attributes and docs right above the function.
            let gated = lines[..i]
                .iter()
                .rev()
                .map(|l| l.trim_start())
                .take_while(|l| l.starts_with("#[") || l.starts_with("///"))
                .any(|l| l.starts_with("#[cfg(feature = \"testing\")]"));
            if !gated {
                found.push(format!("{}:{}: {l}", path.display(), i + 1));
            }
        }
    }
    found
}

#[test]
fn test_hooks_are_behind_the_testing_feature() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let hooks = ungated_hooks(&src);
    assert!(
        hooks.is_empty(),
        "public test hooks outside `testing`: {hooks:#?}"
    );
}

/// The check itself can fail.
#[test]
fn an_ungated_hook_is_found() {
    let dir = std::env::temp_dir().join(format!("dlock-zk-surface-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("x.rs"),
        "/// doc\n#[doc(hidden)]\npub fn a_for_test() {}\n\
         #[cfg(feature = \"testing\")]\n/// doc\npub async fn b_for_test() {}\n",
    )
    .unwrap();
    let hooks = ungated_hooks(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(hooks.len(), 1, "{hooks:?}");
    assert!(hooks[0].contains("a_for_test"));
}
